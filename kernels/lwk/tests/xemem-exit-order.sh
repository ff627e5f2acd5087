#!/usr/bin/env bash
# A forked LWK process that exports memory and exits while the job goes on: its segment must be
# removed, and a host process's attachment of it revoked, before the kernel frees (clears) or
# reuses its frames. Needs /dev/kvm, root (clowderd) and musl-gcc.
#
#   kernels/lwk/tests/xemem-exit-order.sh        # builds what it needs; KERNEL=, CLOWDER_VMM= override
#
# A private clowderd (its own socket under a temporary directory) starts an LWK enclave; the
# job xemem/tests/lwk_exiting_owner.c forks an owner that makes a named segment, and
# xemem/tests/host_lwk_exit_watcher.c attaches it from the host, signals the owner (which
# exits without removing it) and keeps reading: it must see the owner's pattern until SIGBUS,
# never the zeros of freed memory or the next process's writes. Exits non-zero on failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
xemem="$repo/xemem"
work="$repo/kernels/target/lwk-tests/xemem-exit-order"
kernel=$(realpath "${KERNEL:-$repo/kernels/target/x86_64-unknown-none/release/lwk}")
vmm=$(realpath "${CLOWDER_VMM:-$repo/target/release/clowder-vmm}")
rm -rf "$work" && mkdir -p "$work"

fail() { echo "FAIL xemem exit order: $*"; exit 1; }
[ -e /dev/kvm ] || { echo "skip xemem exit order: /dev/kvm is absent"; exit 0; }
[ "$(id -u)" = 0 ] || { echo "skip xemem exit order: clowderd needs root"; exit 0; }
command -v musl-gcc >/dev/null || { echo "skip xemem exit order: musl-gcc is not installed"; exit 0; }
(cd "$repo" && cargo build --release -p clowderd -p clowder-cli -p clowder-vmm --quiet) || fail "cannot build the daemon, the CLI and the VMM"
[ -f "$kernel" ] || (cd "$repo/kernels" && cargo build --release -p lwk --quiet) || fail "cannot build the kernel"

# The job against a musl libxpmem (as xemem/lwk-test.sh builds it), the watcher against the
# host's.
headers="$xemem/build/musl/kernel-headers"
mkdir -p "$headers"
ln -sfn /usr/include/linux "$headers/linux"
ln -sfn "/usr/include/$(gcc -print-multiarch)/asm" "$headers/asm"
ln -sfn /usr/include/asm-generic "$headers/asm-generic"
make -s -C "$xemem" CC="musl-gcc -isystem $headers" BUILD=build/musl build/musl/lib/libxpmem.a || fail "cannot build the musl libxpmem"
make -s -C "$xemem" || fail "cannot build libxpmem"
musl-gcc -isystem "$headers" -static -O2 -Wall -I"$xemem/include" -o "$work/lwk_exiting_owner" \
    "$xemem/tests/lwk_exiting_owner.c" "$xemem/build/musl/lib/libxpmem.a" -lpthread || fail "cannot build the job"
cc -O2 -Wall -I"$xemem/include" -o "$work/host_lwk_exit_watcher" "$xemem/tests/host_lwk_exit_watcher.c" \
    "$xemem/build/lib/libxpmem.a" -lpthread || fail "cannot build the watcher"

export CLOWDER_SOCKET="$work/clowderd.sock"
"$repo/target/release/clowderd" --socket "$CLOWDER_SOCKET" --kernel "$kernel" --vmm "$vmm" --ping-timeout 20000 \
    >"$work/clowderd.log" 2>&1 &
daemon=$!
watcher=
cleanup() {
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null
    "$repo/target/release/clowder" enclave rm exitorder >/dev/null 2>&1
    kill "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$CLOWDER_SOCKET" ] && break; sleep 0.1; done
clowder="$repo/target/release/clowder"
"$clowder" enclave create --name exitorder --cores 1 --mem 128M >"$work/create.log" 2>&1 || fail "enclave create: $(cat "$work/create.log")"

CLOWDER_XEMEM_SOCKET="$work/xemem.sock" timeout 90 "$work/host_lwk_exit_watcher" >"$work/watcher.out" 2>&1 &
watcher=$!
(cd "$work" && timeout 90 "$clowder" run exitorder ./lwk_exiting_owner) >"$work/job.out" 2>&1
job_status=$?
wait "$watcher"
watcher_status=$?
watcher=
"$clowder" logs exitorder >"$work/enclave.log" 2>&1

verdict=0
if [ "$watcher_status" = 0 ] && grep -q '^SIGBUS with the owner' "$work/watcher.out"; then
    echo "ok   xemem exit order: the host attacher got SIGBUS before the exited owner's frames changed"
else
    echo "FAIL xemem exit order: host watcher status $watcher_status: $(cat "$work/watcher.out" | tr '\n' ' ')"
    verdict=1
fi
if [ "$job_status" = 0 ] && grep -q '^owner exited with 0' "$work/job.out" && grep -q '^reuser exited with 0' "$work/job.out"; then
    echo "ok   xemem exit order: the job went on after its owner process exited (status 0)"
else
    echo "FAIL xemem exit order: job status $job_status: $(cat "$work/job.out" | tr '\n' ' ')"
    verdict=1
fi
exit $verdict
