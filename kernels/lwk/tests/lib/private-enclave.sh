# Sourced by the LWK tests that run a job in an enclave of a private clowderd beside host
# programs (tests/xemem-exit-order.sh, tests/tick-after-host-wait.sh): the checks they skip on,
# their builds, the daemon and one enclave, torn down on exit.
#
#   private_enclave_setup NAME "what the test is called"   # sets repo, xemem, work, clowder
#   build_musl_libxpmem                                     # xemem/build/musl's, as lwk-test.sh
#   musl_job OUTPUT SOURCE                                  # a static job against it
#   start_private_enclave ENCLAVE                           # the daemon, then the enclave
# A test may set `on_exit` to a command run before the enclave and daemon go.

private_enclave_setup() { # NAME DESCRIPTION
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    repo=$(cd "$here/../../.." && pwd)
    xemem="$repo/xemem"
    work="$repo/kernels/target/lwk-tests/$1"
    test_name=$2
    kernel=$(realpath "${KERNEL:-$repo/kernels/target/x86_64-unknown-none/release/lwk}")
    vmm=$(realpath "${CLOWDER_VMM:-$repo/target/release/clowder-vmm}")
    clowder="$repo/target/release/clowder"
    rm -rf "$work" && mkdir -p "$work"
    [ -e /dev/kvm ] || { echo "skip $test_name: /dev/kvm is absent"; exit 0; }
    [ "$(id -u)" = 0 ] || { echo "skip $test_name: clowderd needs root"; exit 0; }
    command -v musl-gcc >/dev/null || { echo "skip $test_name: musl-gcc is not installed"; exit 0; }
    (cd "$repo" && cargo build --release -p clowderd -p clowder-cli -p clowder-vmm --quiet) || fail "cannot build the daemon, the CLI and the VMM"
    [ -f "$kernel" ] || (cd "$repo/kernels" && cargo build --release -p lwk --quiet) || fail "cannot build the kernel"
}

fail() { echo "FAIL $test_name: $*"; exit 1; }

build_musl_libxpmem() {
    musl_headers="$xemem/build/musl/kernel-headers"
    mkdir -p "$musl_headers"
    ln -sfn /usr/include/linux "$musl_headers/linux"
    ln -sfn "/usr/include/$(gcc -print-multiarch)/asm" "$musl_headers/asm"
    ln -sfn /usr/include/asm-generic "$musl_headers/asm-generic"
    make -s -C "$xemem" CC="musl-gcc -isystem $musl_headers" BUILD=build/musl build/musl/lib/libxpmem.a || fail "cannot build the musl libxpmem"
}

musl_job() { # OUTPUT SOURCE (which may include node/test-support's clowder_test.h)
    musl-gcc -isystem "$musl_headers" -static -O2 -Wall -I"$xemem/include" -I"$repo/node/test-support/c" -o "$1" "$2" \
        "$xemem/build/musl/lib/libxpmem.a" -lpthread || fail "cannot build the job"
}

start_private_enclave() { # ENCLAVE
    enclave=$1
    export CLOWDER_SOCKET="$work/clowderd.sock"
    "$repo/target/release/clowderd" --socket "$CLOWDER_SOCKET" --kernel "$kernel" --vmm "$vmm" --ping-timeout 20000 \
        >"$work/clowderd.log" 2>&1 &
    daemon=$!
    trap stop_private_enclave EXIT
    for _ in $(seq 100); do [ -S "$CLOWDER_SOCKET" ] && break; sleep 0.1; done
    "$clowder" enclave create --name "$enclave" --cores 1 --mem 128M >"$work/create.log" 2>&1 || fail "enclave create: $(cat "$work/create.log")"
}

stop_private_enclave() {
    [ -n "${on_exit:-}" ] && eval "$on_exit"
    "$clowder" enclave rm "$enclave" >/dev/null 2>&1
    kill "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
}
