#!/usr/bin/env bash
# A thread waiting for a file call the host serves through its CPU's file slot, or from ring 3,
# gives the CPU to the thread queued for it (issue 25): lwk-only/file_slot_waits.c reads
# 32 MiB of /dev/urandom six times on the enclave's one CPU beside a spinning thread, which
# must run during at least 3 of the reads, once with ring-3 file calls (the default) and once
# with the kernel's slots only (CLOWDER_RING3_FILES=off). Both kept the CPU through the host's
# service: the spinner ran during none (the channel path, which sleeps, is
# node/cli-tests/tests/file_call_waits.rs). A private clowderd per case and one LWK enclave;
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
    ran=$(sed -n 's/^the spinner ran during \([0-9]*\) of.*/\1/p' "$work/job-$ring3.out")
    if [ "$status" = 0 ] && [ -n "$ran" ] && [ "$ran" -ge 3 ]; then
        echo "ok   file slot waits (ring-3 file calls $ring3): $(cat "$work/job-$ring3.out")"
    else
        echo "FAIL file slot waits (ring-3 file calls $ring3): job status $status: $(tr '\n' ' ' <"$work/job-$ring3.out")"
        failed=1
    fi
done
exit $failed
