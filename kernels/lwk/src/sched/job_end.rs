//! Job-end hand-off: a job ending on a CPU other than 0 asks CPU 0 (where the service loop
//! runs) to end it; the ended job's threads are released.

use super::park::park;
use super::{apic_id, ONLINE_CPUS, SCHEDULER};
use crate::arch::apic;
use crate::arch::tables;
use crate::arch::trap::KERNEL_STACK_SIZE;
use crate::job;
use crate::mm::pmem;
use core::sync::atomic::{AtomicU32, Ordering};

/// A persistent enclave's job ended (it exited, or the host killed it) on a CPU other than
/// 0: the status for CPU 0 to report, since the service loop runs there (the channel
/// interrupt arrives there). `NO_END_REQUEST` otherwise.
pub(super) static JOB_END_REQUEST: AtomicU32 = AtomicU32::new(NO_END_REQUEST);
pub(super) const NO_END_REQUEST: u32 = u32::MAX;

/// Called on a CPU other than 0 when the job ends there: asks CPU 0 to end it (the first
/// request wins, as the first `exit_group` does on Linux) and parks this CPU. CPU 0 notices
/// at its next tick, idle round or wake-up (`end_job_if_requested`).
pub fn hand_job_end_to_cpu0(status: u32) -> ! {
    let cpu = tables::current_cpu();
    let _ = JOB_END_REQUEST.compare_exchange(NO_END_REQUEST, status, Ordering::AcqRel, Ordering::Acquire);
    if let Some(apic_id) = apic_id(0) {
        apic::send_tick(apic_id);
    }
    park(cpu)
}

/// On CPU 0, where no lock is held: ends the job if another CPU asked for it.
pub fn end_job_if_requested(cpu: usize) {
    if cpu == 0 && JOB_END_REQUEST.load(Ordering::Acquire) != NO_END_REQUEST {
        let status = JOB_END_REQUEST.swap(NO_END_REQUEST, Ordering::AcqRel);
        if status != NO_END_REQUEST {
            job::exit(status);
        }
    }
}

/// Forgets a finished job's end request once every other CPU has parked (none can add one).
pub fn clear_job_end_request() {
    JOB_END_REQUEST.store(NO_END_REQUEST, Ordering::Release);
}

/// The job is over and no CPU runs its threads (the others parked, this one on the service
/// stack with the kernel's tables): frees the kernel stacks of its threads and drops the
/// scheduler.
pub fn release_job_threads() {
    let Some(scheduler) = SCHEDULER.lock().take() else { return };
    ONLINE_CPUS.store(0, Ordering::Release);
    let stacks = scheduler.threads.values().filter_map(|thread| thread.stack_physical);
    for stack in stacks.chain(scheduler.cpus.iter().flat_map(|cpu| cpu.exited_stacks.iter().copied())) {
        pmem::free(stack, KERNEL_STACK_SIZE);
    }
}
