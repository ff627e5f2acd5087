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
source "$here/lib/private-enclave.sh"
private_enclave_setup xemem-exit-order "xemem exit order"

# The job against a musl libxpmem, the watcher against the host's.
build_musl_libxpmem
make -s -C "$xemem" || fail "cannot build libxpmem"
musl_job "$work/lwk_exiting_owner" "$xemem/tests/lwk_exiting_owner.c"
cc -O2 -Wall -I"$xemem/include" -o "$work/host_lwk_exit_watcher" "$xemem/tests/host_lwk_exit_watcher.c" \
    "$xemem/build/lib/libxpmem.a" -lpthread || fail "cannot build the watcher"

watcher=
on_exit='[ -n "$watcher" ] && kill "$watcher" 2>/dev/null'
start_private_enclave exitorder

CLOWDER_XEMEM_SOCKET="$work/xemem.sock" timeout 90 "$work/host_lwk_exit_watcher" >"$work/watcher.out" 2>&1 &
watcher=$!
(cd "$work" && timeout 90 "$clowder" run "$enclave" ./lwk_exiting_owner) >"$work/job.out" 2>&1
job_status=$?
wait "$watcher"
watcher_status=$?
watcher=
"$clowder" logs "$enclave" >"$work/enclave.log" 2>&1

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
