# clowder: the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
KERNELS_OUT := kernels/target/x86_64-unknown-none/release

.PHONY: all bootstrap build kernels test test-host test-kernels test-dex demo bench clean

all: build

bootstrap:
	@./scripts/bootstrap.sh

kernels: bootstrap
	@cd kernels && $(CARGO) build --release --quiet

build: bootstrap kernels
	@$(CARGO) build --release --quiet --workspace

# Host crates' unit tests and the VMM's KVM integration tests (which boot kernels/testguest).
test-host: build
	@$(CARGO) test --release --workspace

test-kernels: build
	@if [ -x kernels/lwk/tests/run.sh ]; then kernels/lwk/tests/run.sh; fi

test-dex: bootstrap
	@if [ -x dex/test.sh ]; then dex/test.sh; fi

test: test-host test-kernels test-dex

demo: build
	@./scripts/demo.sh

bench: build
	@./bench/run.sh

clean:
	$(CARGO) clean
	cd kernels && $(CARGO) clean
