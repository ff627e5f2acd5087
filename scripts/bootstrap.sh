#!/usr/bin/env bash
# Installs what clowder's build, tests and demo need and is missing; silent when all is present.
# Idempotent: safe to run before every `make` target.
set -euo pipefail

say() { echo "bootstrap: $*" >&2; }

# Rust target for the lightweight kernel and the VMM test guests.
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-none; then
    say "adding Rust target x86_64-unknown-none"
    rustup target add x86_64-unknown-none >/dev/null
fi
# rustfmt for `make check-format` (part of rustup's default profile, not of the minimal one).
if ! cargo fmt --version >/dev/null 2>&1; then
    say "adding the rustfmt component"
    rustup component add rustfmt >/dev/null
fi

# Debian packages: QEMU (differential tests of the kernel under TCG), musl (static test
# programs), busybox-static (the LWK's compatibility tests), gdb-less build tools are present.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v musl-gcc >/dev/null || need+=(musl-tools)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -f /usr/include/ucp/api/ucp.h ] || need+=(libucx-dev)   # dex's UCX transport
[ -f /usr/include/nettle/hmac.h ] || need+=(nettle-dev)    # dex's connection authentication (HMAC-SHA256)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)               # dex's --hosts over ssh test (sshd in network namespaces)
command -v mpirun >/dev/null || need+=(openmpi-bin)             # dex's PMIx launcher test (mpirun)
command -v mpicc.openmpi >/dev/null || need+=(libopenmpi-dev)   # apps/mpi (make test-mpi, the MPI benchmark)
pkg-config --exists pmix 2>/dev/null || need+=(libpmix-dev)     # dex's PMIx client (libdex-pmix.so)
command -v slurmctld >/dev/null || need+=(slurmctld)            # dex's Slurm test (srun -N 2 --mpi=pmix; munge comes along)
command -v slurmd >/dev/null || need+=(slurmd)
command -v srun >/dev/null || need+=(slurm-client)
command -v help2man >/dev/null || need+=(help2man)             # make install's man pages, from each program's --help
command -v gfortran >/dev/null || need+=(gfortran)               # the LWK's dynamically linked Fortran test program
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        say "missing packages: ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}"
        exit 1
    fi
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# Python packages of python/test.sh (the clowder package's tests), for the python3 on PATH:
# numpy, pytest, and wheel for pip's build of ./python. From PyPI; where pip may not install
# (Debian's own python3, PEP 668), Debian's python3-* packages.
py_need=()
for module in numpy pytest wheel; do
    python3 -c "import $module" 2>/dev/null || py_need+=("$module")
done
if [ ${#py_need[@]} -gt 0 ]; then
    say "installing Python packages ${py_need[*]}"
    if ! python3 -m pip install -q --disable-pip-version-check "${py_need[@]}" >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends "${py_need[@]/#/python3-}" >/dev/null
    fi
fi
