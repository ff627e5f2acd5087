#!/usr/bin/env bash
# A thread waiting with no timeout in a persistent enclave, in poll or epoll_wait, in recv on
# a socket or in read of an XEMEM notification descriptor, sleeps until its news comes:
# lwk-only/quiet_poll.c parks four such threads while its main thread spins 3 s on the
# enclave's one CPU. The kernel's count of the job's entries (`clowder logs`,
# syscall/census.rs) must show fewer than 40 timer ticks (9-24 seen: the waiters' start and
# the socket's host round trips take some). When such waits woke every 100 ms (two ticks
# each: the wake, then the spinner's slice ending), poll's two waiters took about 120 in
# those 3 s, and the socket's and the notification's waiters as many (118) after poll's got
# 10 s slices: emulated kernel work taken from the spinner (an MPI rank's main thread beside
# PMIx's, Open MPI's and UCX's waiting threads). Needs /dev/kvm, root (clowderd) and
# musl-gcc.
#
#   kernels/lwk/tests/quiet-poll.sh     # KERNEL=, CLOWDER_VMM= override
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/private-enclave.sh"
private_enclave_setup quiet-poll "quiet poll"
build_musl_libxpmem
musl_job "$work/quiet_poll" "$here/lwk-only/quiet_poll.c"
start_private_enclave quietpoll
(cd "$work" && timeout 60 "$clowder" run "$enclave" ./quiet_poll) >"$work/job.out" 2>&1
status=$?
"$clowder" logs "$enclave" >"$work/enclave.log" 2>&1
ticks=$(sed -n 's/.*job.s kernel entries: .* \([0-9]*\) timer ticks.*/\1/p' "$work/enclave.log" | tail -1)
if [ "$status" = 0 ] && grep -q '^all four waiters woke for their news' "$work/job.out" && [ -n "$ticks" ] && [ "$ticks" -lt 40 ]; then
    echo "ok   quiet poll: four waiters slept through 3 s of spinning ($ticks timer ticks)"
else
    echo "FAIL quiet poll: job status $status, ${ticks:-no} timer ticks (want fewer than 40): $(tr '\n' ' ' <"$work/job.out")"
    exit 1
fi
