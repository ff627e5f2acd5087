#!/usr/bin/env bash
# A time slice that ends while the CPU waits in the kernel for the host (interrupts on, the
# tick finding no user context) must still end: lwk-only/wake_after_host_wait.c wakes a thread,
# makes XPMEM host round trips, then spins in user mode on its enclave's one CPU; the woken
# thread must run. Before the kernel took such a tick again on the way back to user mode, the
# spinner kept the CPU for ever (UCX's MPI_Finalize fence beside PMIx's thread). A private
# clowderd and one LWK enclave; needs /dev/kvm, root (clowderd) and musl-gcc.
#
#   kernels/lwk/tests/tick-after-host-wait.sh     # KERNEL=, CLOWDER_VMM= override
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
xemem="$repo/xemem"
work="$repo/kernels/target/lwk-tests/tick-after-host-wait"
kernel=$(realpath "${KERNEL:-$repo/kernels/target/x86_64-unknown-none/release/lwk}")
vmm=$(realpath "${CLOWDER_VMM:-$repo/target/release/clowder-vmm}")
rm -rf "$work" && mkdir -p "$work"

fail() { echo "FAIL tick after a host wait: $*"; exit 1; }
[ -e /dev/kvm ] || { echo "skip tick after a host wait: /dev/kvm is absent"; exit 0; }
[ "$(id -u)" = 0 ] || { echo "skip tick after a host wait: clowderd needs root"; exit 0; }
command -v musl-gcc >/dev/null || { echo "skip tick after a host wait: musl-gcc is not installed"; exit 0; }
(cd "$repo" && cargo build --release -p clowderd -p clowder-cli -p clowder-vmm --quiet) || fail "cannot build the daemon, the CLI and the VMM"
[ -f "$kernel" ] || (cd "$repo/kernels" && cargo build --release -p lwk --quiet) || fail "cannot build the kernel"

# The job against a musl libxpmem (as xemem/lwk-test.sh builds it).
headers="$xemem/build/musl/kernel-headers"
mkdir -p "$headers"
ln -sfn /usr/include/linux "$headers/linux"
ln -sfn "/usr/include/$(gcc -print-multiarch)/asm" "$headers/asm"
ln -sfn /usr/include/asm-generic "$headers/asm-generic"
make -s -C "$xemem" CC="musl-gcc -isystem $headers" BUILD=build/musl build/musl/lib/libxpmem.a || fail "cannot build the musl libxpmem"
musl-gcc -isystem "$headers" -static -O2 -Wall -I"$xemem/include" -o "$work/wake_after_host_wait" \
    "$here/lwk-only/wake_after_host_wait.c" "$xemem/build/musl/lib/libxpmem.a" -lpthread || fail "cannot build the job"

export CLOWDER_SOCKET="$work/clowderd.sock"
"$repo/target/release/clowderd" --socket "$CLOWDER_SOCKET" --kernel "$kernel" --vmm "$vmm" --ping-timeout 20000 \
    >"$work/clowderd.log" 2>&1 &
daemon=$!
clowder="$repo/target/release/clowder"
cleanup() {
    "$clowder" enclave rm tickwait >/dev/null 2>&1
    kill "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$CLOWDER_SOCKET" ] && break; sleep 0.1; done
"$clowder" enclave create --name tickwait --cores 1 --mem 128M >"$work/create.log" 2>&1 || fail "enclave create: $(cat "$work/create.log")"
(cd "$work" && timeout 60 "$clowder" run tickwait ./wake_after_host_wait) >"$work/job.out" 2>&1
status=$?
if [ "$status" = 0 ] && grep -q '^the woken thread ran beside the spinning one' "$work/job.out"; then
    echo "ok   tick after a host wait: the woken thread ran beside a thread spinning after XPMEM host calls"
else
    echo "FAIL tick after a host wait: job status $status: $(tr '\n' ' ' <"$work/job.out")"
    exit 1
fi
