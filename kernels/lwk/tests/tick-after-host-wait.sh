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
source "$here/lib/private-enclave.sh"
private_enclave_setup tick-after-host-wait "tick after a host wait"
build_musl_libxpmem
musl_job "$work/wake_after_host_wait" "$here/lwk-only/wake_after_host_wait.c"
start_private_enclave tickwait
(cd "$work" && timeout 60 "$clowder" run "$enclave" ./wake_after_host_wait) >"$work/job.out" 2>&1
status=$?
if [ "$status" = 0 ] && grep -q '^the woken thread ran beside the spinning one' "$work/job.out"; then
    echo "ok   tick after a host wait: the woken thread ran beside a thread spinning after XPMEM host calls"
else
    echo "FAIL tick after a host wait: job status $status: $(tr '\n' ' ' <"$work/job.out")"
    exit 1
fi
