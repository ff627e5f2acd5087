#!/usr/bin/env bash
# A thread whose timed wait ends gets the CPU within a slice while another thread spins in
# user mode with a system call every 5 ms (lwk-only/slice_ticks.c, on the enclave's one CPU),
# and the kernel's stall notes (`clowder logs`, sched/stalls.rs) blame no run for that: a
# run's time alone on its CPU is no stall, only the time others waited for it. The notes said
# "kept cpu 0 10529 ms while 1 waited (213 returns to user mode, 1 ticks there)" when a thread
# of a 10 s poll slice woke beside a spinner that had run alone until then, and were read as
# lost ticks (docs/mpi.md, "Ticks that do not come"). A private clowderd and one LWK enclave;
# needs /dev/kvm, root (clowderd) and musl-gcc.
#
#   kernels/lwk/tests/slice-ticks.sh     # KERNEL=, CLOWDER_VMM= override
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/private-enclave.sh"
private_enclave_setup slice-ticks "slice ticks"
build_musl_libxpmem
musl_job "$work/slice_ticks" "$here/lwk-only/slice_ticks.c"
start_private_enclave sliceticks
(cd "$work" && timeout 60 "$clowder" run "$enclave" ./slice_ticks) >"$work/job.out" 2>&1
status=$?
"$clowder" logs "$enclave" >"$work/enclave.log" 2>&1
notes=$(grep -c 'stall:' "$work/enclave.log")
if [ "$status" = 0 ] && [ "$notes" = 0 ]; then
    echo "ok   slice ticks: a woken thread got the CPU beside a spinner making system calls ($(cat "$work/job.out")), no stall noted"
else
    echo "FAIL slice ticks: job status $status ($(tr '\n' ' ' <"$work/job.out")), $notes stall notes: $(grep 'stall:' "$work/enclave.log" | head -3 | tr '\n' ' ')"
    exit 1
fi
