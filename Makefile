# clowder: the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
KERNELS_OUT := kernels/target/x86_64-unknown-none/release
FUZZ_SECONDS ?= 60
FUZZ_CI_SECONDS ?= 15
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all bootstrap build install test-install-ucx kernels test test-host test-kernels test-dex test-xemem test-adios2 test-ucx test-fuzz check-format test-linux test-linux-enclave test-linux-xemem test-big test-mpi test-mpi-ucx-loop demo bench bench-insitu fuzz clean

all: build

bootstrap:
	@./scripts/bootstrap.sh

kernels: bootstrap
	@cd kernels && $(CARGO) build --release --quiet

build: bootstrap kernels
	@$(CARGO) build --release --quiet --workspace

# make install PREFIX=/usr/local DESTDIR=...: binaries, the LWK, libxpmem, libdex, man pages,
# the systemd unit and the default configuration (scripts/install.sh).
install: build
	@PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) scripts/install.sh

# Opt-in, 3-6 minutes the first time: the whole of UCX built against an installed tree by
# pkg-config alone (make test's install-test.sh builds only its xpmem transport that way).
test-install-ucx: build
	@scripts/install-ucx-test.sh

# Host crates' unit tests and the VMM's KVM integration tests (which boot kernels/testguest).
test-host: build
	@$(CARGO) test --release --workspace

# The same kernel images under QEMU TCG (differential) and, for the LWK, under clowder-vmm.
test-kernels: build
	@kernels/testguest/qemu-test.sh
	@RUNNER=qemu kernels/lwk/test.sh
	@if [ -e /dev/kvm ]; then RUNNER=vmm CLOWDER_VMM=target/release/clowder-vmm kernels/lwk/test.sh; \
	 else echo "test-kernels: skipping the LWK under clowder-vmm: /dev/kvm is absent"; fi

test-dex: bootstrap
	@if [ -x dex/test.sh ]; then dex/test.sh; fi

# The XPMEM conformance suite over the host backend (libxpmem + the segment broker).
test-xemem: build
	@xemem/test.sh
	@if [ -x build/ucx/install/bin/ucx_perftest ]; then xemem/ucx/test.sh; \
	 else echo "test-xemem: UCX's xpmem transport not tested: UCX is not built here (make test-ucx builds it, ~3 min)"; fi

# The ADIOS2 plugin engine over XEMEM (coupling/adios2): the adios2 wheel from PyPI, cached in
# build/adios2, and ADIOS2's C++, C and Python programs switched to it by configuration.
test-adios2: build
	@coupling/adios2/test.sh

# UCX (Debian's source package) built against our xpmem.h/libxpmem, then ucx_perftest over it.
test-ucx: build
	@xemem/ucx/build.sh
	@xemem/ucx/test.sh

# One style for every Rust crate (rustfmt.toml at the root), in both workspaces: checked here,
# fixed by `cargo fmt --all` (and the same in kernels/).
check-format: bootstrap
	@$(CARGO) fmt --all --check >/dev/null || { $(CARGO) fmt --all --check | head -30; echo "check-format: run cargo fmt --all"; exit 1; }
	@cd kernels && $(CARGO) fmt --all --check >/dev/null || { $(CARGO) fmt --all --check | head -30; echo "check-format: run cargo fmt --all in kernels/"; exit 1; }

# CI's share of fuzzing: every target briefly from its committed corpus; a crash fails it.
test-fuzz: bootstrap
	@FUZZ_SECONDS=$(FUZZ_CI_SECONDS) scripts/fuzz.sh

test: check-format test-host test-kernels test-dex test-xemem test-adios2 test-fuzz
	@apps/test.sh
	@scripts/check-script-arguments.sh
	@scripts/install-test.sh
	@if [ -e /dev/kvm ]; then scripts/insitu.sh --check --config a,b,c,d --data-mb 1 16 16 16 120 40 1; else echo "test: in-situ check skipped: /dev/kvm is absent"; fi

# Opt-in, slow on PVM hosts: a stock Debian kernel boots to its banner (docs/linux-guest.md).
test-linux: build
	@$(CARGO) test --release -p clowder-vmm --test linux_boot -- --ignored --nocapture debian_kernel

# Opt-in, many minutes on PVM hosts: the small guest kernel (scripts/linux-kernel.sh, cached
# per machine) boots to its enclave agent (docs/linux-guest.md).
test-linux-enclave: build
	@$(CARGO) test --release -p clowder-vmm --test linux_boot -- --ignored --nocapture small_kernel
	@$(CARGO) test --release -p clowder-cli-tests --test linux_enclave -- --ignored --nocapture

# Opt-in, many minutes on PVM hosts: XEMEM between host processes and a booted Linux enclave,
# both ways, a guest exporter that ends without removing, VM<->VM (a second Linux enclave booted
# alongside) and LWK<->VM (docs/xemem-pci.md);
# CLOWDER_XEMEM_VM_BENCH=1 adds the VM rows of Table 2 measured in the same VM. The jobs are
# static: no host files (their FUSE mount can hold the agent's loop for minutes under load).
# Then the in-situ composition with the analytics in a Linux enclave (scripts/insitu.sh's
# lwk-linux: the host's glibc analytics from the host's files, the simulation in an LWK).
test-linux-xemem: build
	@CLOWDER_LINUX_HOST_FILES=0 $(CARGO) test --release -p clowderd --test xemem_linux_vm -- --ignored --nocapture one_xpmem_program
	@scripts/insitu.sh --check --config e --data-mb 1 16 16 16 120 40 1

# Opt-in, minutes and most of the machine's memory: 16 GiB enclaves (2 MiB and 4 KiB pages)
# are created, run a job and are removed (issue 22's big enclaves).
test-big: build
	@$(CARGO) test --release -p clowderd --test big_enclave -- --ignored --test-threads 1

# Opt-in, about 5 minutes: MPI programs under mpirun (over ssh) and srun on two "nodes" (network
# namespaces, each with its clowderd, sshd and slurmd), as host ranks and as enclave ranks.
test-mpi: build
	@scripts/mpi-test.sh

# Opt-in, about a minute a run: test-mpi's UCX case between enclaves a and b, UCX_LOOP_RUNS times
# in a row (default 16), keeping each failing run's diagnostics in build/ucx-loop (docs/mpi.md).
UCX_LOOP_RUNS ?= 16
test-mpi-ucx-loop: build
	@apps/mpi/ucx-loop.sh --runs $(UCX_LOOP_RUNS)

# Every fuzz target (PACKAGE/fuzz, dex/fuzz) for FUZZ_SECONDS each (docs/results/fuzz.md).
fuzz: bootstrap
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

demo: build
	@./scripts/demo.sh

bench: build
	@./bench/run.sh

# The in-situ matrix, interference, attach noise and scaling (about an hour): docs/results/insitu.md.
bench-insitu: build
	@./bench/insitu/run.sh

clean:
	$(CARGO) clean
	cd kernels && $(CARGO) clean
