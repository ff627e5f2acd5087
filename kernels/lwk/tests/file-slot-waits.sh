#!/usr/bin/env bash
# A thread waiting for a file call the host serves through its CPU's file slot, or from ring 3,
# gives the CPU to the thread queued for it (issue 25): lwk-only/file_slot_waits.c reads
# 32 MiB of /dev/urandom up to 32 times on the enclave's one CPU while a spinning thread naps; in
# the rounds where it wakes during the read it must run before the read ends in at least half
# (and there must be 3 such rounds), once with ring-3 file calls (the default) and once with
# the kernel's slots only (CLOWDER_RING3_FILES=off). Both kept the CPU through the host's
# service (the channel path, which sleeps, is node/cli-tests/tests/file_call_waits.rs). Not a
# sure failure before the fix (3ec9334, a7d569c): at load 10 an earlier form of this job saw
# the napper run in 1-2 of 6 reads with the kernel's slots; at load 17 in all that counted (a
# read whose buffer is several physical runs is several calls, and the CPU changes hands
# between them; the host's pump may not take a ring-3 call in time). A private clowderd per case and one LWK enclave;
# needs /dev/kvm, root (clowderd) and musl-gcc.
#
#   kernels/lwk/tests/file-slot-waits.sh     # KERNEL=, CLOWDER_VMM= override
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/private-enclave.sh"
private_enclave_setup file-slot-waits "file slot waits"
build_musl_libxpmem
musl_job "$work/file_slot_waits" "$here/lwk-only/file_slot_waits.c"
failed=0
for ring3 in on off; do
    # The daemon reads it when it starts the enclave.
    CLOWDER_RING3_FILES=$ring3 start_private_enclave slotwaits
    (cd "$work" && timeout 120 "$clowder" run "$enclave" ./file_slot_waits) >"$work/job-$ring3.out" 2>&1
    status=$?
    stop_private_enclave
    trap - EXIT
    rm -f "$CLOWDER_SOCKET"
    read -r ran counted < <(sed -n 's/^the napper ran in \([0-9]*\) of \([0-9]*\) rounds.*/\1 \2/p' "$work/job-$ring3.out")
    if [ "$status" = 0 ] && [ -n "${counted:-}" ] && [ "$counted" -ge 3 ] && [ $((2 * ran)) -ge "$counted" ]; then
        echo "ok   file slot waits (ring-3 file calls $ring3): $(cat "$work/job-$ring3.out")"
    else
        echo "FAIL file slot waits (ring-3 file calls $ring3): job status $status: $(tr '\n' ' ' <"$work/job-$ring3.out")"
        failed=1
    fi
done
exit $failed
