//! Run queues and switching: the idle loop, entering and leaving a CPU, time slices.

use super::job_end::end_job_if_requested;
use super::park::park_if_requested;
use super::stalls::{self, Note};
use super::tlb::flush_tlb_if_stale;
use super::{apic_id, use_kernel_tables, with_scheduler, Scheduler, State, WaitResult, CURRENT_PID, LOADED_ASPACE, QUEUED};
use crate::arch::apic;
use crate::arch::cpu::{self, MSR_FS_BASE, MSR_GS_BASE};
use crate::arch::fpu;
use crate::arch::tables::{self, MAX_CPUS};
use crate::arch::trap::{self, KERNEL_STACK_SIZE, MAX_THREADS};
use crate::clock;
use crate::mm::pmem;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(super) extern "C" fn idle_entry() -> ! {
    idle_loop(tables::current_cpu())
}

/// How many idle polls pass between checks for expired timed waits and dead-lock, on a
/// CPU that cannot sleep.
const IDLE_CHECK_INTERVAL: u32 = 1024;

enum IdleStep {
    Run(usize, u64, u64, Option<(u64, u64)>, Option<Note>),
    /// Nothing to do until another CPU queues a thread here and sends the wake-up IPI, or the
    /// timer ends a timed wait of this CPU.
    Sleep,
    /// The CPU has no x2APIC (neither the wake-up IPI nor a timer reach it): look again soon.
    Poll,
}

/// A CPU with no thread to run: sleeps in HLT when only a wake-up IPI can give it work, else
/// polls its queue and the clock.
pub(super) fn idle_loop(cpu: usize) -> ! {
    loop {
        park_if_requested(cpu);
        end_job_if_requested(cpu);
        let step = with_scheduler(|scheduler| {
            expire_timed_waits(scheduler, cpu);
            if let Some(next) = scheduler.dequeue(cpu) {
                let (slot, stack_top, pid, load, note) = enter_thread(scheduler, cpu, next, false);
                return IdleStep::Run(slot, stack_top, pid, load, note);
            }
            if apic_id(cpu).is_none() {
                return IdleStep::Poll;
            }
            // The timer ends the sleep at this CPU's nearest timed wait, if it has one. Polling
            // for it instead (each round a walk of every thread under the scheduler's lock,
            // emulated on PVM) kept an idle CPU busy and the lock contended: cli-test
            // process_groups_killed_while_forking's idle CPU spent all its time there.
            arm_next_event(scheduler, cpu);
            IdleStep::Sleep
        });
        match step {
            IdleStep::Run(slot, stack_top, pid, load, note) => {
                stalls::log_note(note);
                settle_process(cpu, pid, load);
                trap::wait_until_saved(slot);
                fpu::resume(cpu, slot);
                trap::switch_context(cpu, trap::idle_slot(cpu), slot, stack_top);
                free_exited_stacks(cpu);
            }
            IdleStep::Sleep => {
                drop_address_space(cpu);
                apic::sleep_until_interrupt()
            }
            IdleStep::Poll => {
                drop_address_space(cpu);
                // Interrupts stay off while this CPU polls: a persistent enclave's host, which
                // pings every second, is served from here meanwhile.
                crate::enclave::serve_host_while_polling(cpu);
                for _ in 0..IDLE_CHECK_INTERVAL {
                    if QUEUED[cpu].load(Ordering::Acquire) != 0 {
                        break;
                    }
                    core::hint::spin_loop();
                }
            }
        }
    }
}

/// An idle CPU lets go of the last process's address space, which may be freed meanwhile.
fn drop_address_space(cpu: usize) {
    if LOADED_ASPACE[cpu].load(Ordering::Relaxed) != 0 {
        use_kernel_tables(cpu);
    }
}

/// Makes `next` the running thread of `cpu`; returns its context slot, stack and process,
/// and its address space if this CPU must load it: both for `settle_process`, once the lock
/// is dropped and the leaving thread's vector registers are saved in its own process. The
/// thread gets a time slice, enforced by the timer only if others wait for this CPU or a
/// timed wait here may end meanwhile (tickless otherwise); `stays` (it is the thread that
/// just left, a wait that did not block) keeps the slice it had. A new slice there let a
/// thread that loops on such waits keep the CPU for ever once the host was quiet (each call
/// far shorter than a slice): an MPI rank sleeping 100 us at a time (the emulated kernel
/// reaches the deadline check after it) while PMIx's thread, queued here, had the work
/// (issue 25, UCX between enclaves; cli-test short_sleeps_share_the_cpu). Also the stall
/// note if `next` waited long for the CPU (`stalls`).
fn enter_thread(scheduler: &mut Scheduler, cpu: usize, next: u64, stays: bool) -> (usize, u64, u64, Option<(u64, u64)>, Option<Note>) {
    flush_tlb_if_stale();
    scheduler.cpus[cpu].current = Some(next);
    let queued = scheduler.cpus[cpu].run_queue.len();
    // One look-up of the thread and one clock read: each is emulated work on PVM, paid at
    // every switch (four look-ups and two reads made some 10% of a hand-over by sched_yield).
    let thread = scheduler.threads.get_mut(&next).expect("next thread");
    let now = clock::monotonic_ns();
    let note = stalls::on_enter(thread, cpu, next, queued, now);
    // A thread that stays (a wait that did not block) is run again without `enqueue`.
    thread.queued_at = 0;
    crate::arch::fastcall::thread_entered(cpu, next);
    start_run_at(cpu, thread.cpu_time_ns, now);
    if !stays {
        QUANTUM_END[cpu].store(cpu::read_tsc() + clock::tsc_hz() * QUANTUM_MS / 1000, Ordering::Relaxed);
    }
    super::CURRENT_JOB[cpu].store(thread.job, Ordering::Relaxed);
    cpu::write_msr(MSR_FS_BASE, thread.fs_base);
    cpu::write_msr(MSR_GS_BASE, thread.gs_base);
    let load = (LOADED_ASPACE[cpu].load(Ordering::Relaxed) != thread.aspace.0).then_some(thread.aspace);
    let entered = (thread.slot, thread.stack_top, thread.pid, load, note);
    if thread.doomed {
        // It ends at its next entry to the kernel: make that now (a thread that never ran
        // starts straight in user mode).
        apic::arm_timer(cpu::read_tsc());
    } else {
        arm_for_entry(scheduler, cpu);
    }
    entered
}

/// When each CPU's current thread entered it (`clock::monotonic_ns`): its CPU time grows from
/// there.
pub(super) static RUN_START: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// A thread that has run `cpu_time_ns` starts a run on `cpu`: the fast calls then read its
/// CPU time as the clock plus (`cpu_time_ns` - now).
pub(super) fn start_run(cpu: usize, cpu_time_ns: u64) {
    start_run_at(cpu, cpu_time_ns, clock::monotonic_ns());
}

/// `start_run` with the clock read at `now`.
fn start_run_at(cpu: usize, cpu_time_ns: u64, now: u64) {
    RUN_START[cpu].store(now, Ordering::Relaxed);
    crate::arch::fastcall::thread_clock_changed(cpu, cpu_time_ns.wrapping_sub(now));
}

/// The thread leaving `cpu` (if one runs there) adds its run to its CPU time; the stall note
/// if it kept the CPU long from others (`stalls`).
fn end_run(scheduler: &mut Scheduler, cpu: usize) -> Option<Note> {
    let ran_ns = clock::monotonic_ns().saturating_sub(RUN_START[cpu].load(Ordering::Relaxed));
    let note = stalls::on_leave(scheduler, cpu, ran_ns);
    let thread = scheduler.cpus[cpu].current.and_then(|tid| scheduler.threads.get_mut(&tid))?;
    thread.cpu_time_ns += ran_ns;
    note
}

/// `cpu` now runs process `pid`, in `load` if it must load that address space.
fn settle_process(cpu: usize, pid: u64, load: Option<(u64, u64)>) {
    CURRENT_PID[cpu].store(pid, Ordering::Relaxed);
    if !crate::arch::fastcall::runs_process(cpu, pid) {
        crate::process::publish_running(cpu, pid);
    }
    if let Some(aspace) = load {
        crate::arch::paging::activate_root(aspace.1);
        LOADED_ASPACE[cpu].store(aspace.0, Ordering::Release);
    }
}

/// Wakes this CPU's threads whose timed wait has expired.
fn expire_timed_waits(scheduler: &mut Scheduler, cpu: usize) {
    let now = clock::monotonic_ns();
    let expired: Vec<u64> = scheduler
        .threads
        .iter()
        .filter(|(_, thread)| {
            thread.cpu == cpu && matches!(thread.state, State::Waiting { deadline: Some(deadline), .. } if deadline <= now)
        })
        .map(|(&tid, _)| tid)
        .collect();
    for tid in expired {
        let thread = scheduler.threads.get_mut(&tid).expect("waiting thread");
        thread.state = State::Runnable;
        thread.wait_result = WaitResult::TimedOut;
        scheduler.enqueue(tid);
    }
}

/// Arms `cpu`'s timer (the caller's own) for its next event: the end of the running thread's
/// slice if others wait for the CPU, or the nearest deadline of a timed wait here, which must
/// end on time though the running thread may never enter the kernel; disarms it when there is
/// neither.
pub(super) fn arm_next_event(scheduler: &Scheduler, cpu: usize) {
    let slice_end = (!scheduler.cpus[cpu].run_queue.is_empty()).then(|| QUANTUM_END[cpu].load(Ordering::Relaxed));
    let nearest_deadline = scheduler
        .threads
        .values()
        .filter_map(|thread| match thread.state {
            State::Waiting { deadline: Some(deadline), .. } if thread.cpu == cpu => Some(deadline),
            _ => None,
        })
        .min()
        .map(deadline_tsc);
    NEXT_WAIT_END[cpu].store(nearest_deadline.unwrap_or(u64::MAX), Ordering::Relaxed);
    match slice_end.into_iter().chain(nearest_deadline).min() {
        Some(tsc) => apic::arm_timer(tsc),
        None => apic::disarm_timer(),
    }
}

/// As `arm_next_event`, for a thread entering `cpu`, with the nearest timed wait as last
/// recorded rather than found by a walk of every thread (emulated work at every switch on
/// PVM). A new timed wait lowers the record (`note_timed_wait`); one that ended otherwise
/// leaves it early, and the tick it brings finds nothing due and arms anew.
fn arm_for_entry(scheduler: &Scheduler, cpu: usize) {
    let slice_end = if scheduler.cpus[cpu].run_queue.is_empty() { u64::MAX } else { QUANTUM_END[cpu].load(Ordering::Relaxed) };
    match slice_end.min(NEXT_WAIT_END[cpu].load(Ordering::Relaxed)) {
        u64::MAX => apic::disarm_timer(),
        tsc => apic::arm_timer(tsc),
    }
}

/// A thread of `cpu` starts a wait that ends at `deadline` (monotonic ns) at the latest.
pub(super) fn note_timed_wait(cpu: usize, deadline: u64) {
    NEXT_WAIT_END[cpu].fetch_min(deadline_tsc(deadline), Ordering::Relaxed);
}

/// The TSC at monotonic time `deadline` (ns).
fn deadline_tsc(deadline: u64) -> u64 {
    let wait_ns = deadline.saturating_sub(clock::monotonic_ns()) as u128;
    cpu::read_tsc().saturating_add((wait_ns * clock::tsc_hz() as u128 / 1_000_000_000) as u64)
}

/// Per CPU: the TSC at which its nearest timed wait ends (`u64::MAX`: none), as last armed or
/// lowered since (`note_timed_wait`).
static NEXT_WAIT_END: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(u64::MAX) }; MAX_CPUS];

/// Leaves this CPU to its next runnable thread, or to its idle loop, after `prepare` (given
/// the CPU) has said why (changing the current thread's state, under the lock) and returned
/// the current thread's context slot. Returns when the current thread runs again, maybe on
/// another CPU (`Scheduler::place`): a caller must not use a CPU index it read before.
pub(super) fn leave_cpu(prepare: impl FnOnce(&mut Scheduler, usize) -> usize) {
    let cpu = tables::current_cpu();
    let (from, to, stack_top, next_process, notes) = with_scheduler(|scheduler| {
        let leaving = scheduler.cpus[cpu].current;
        let held = end_run(scheduler, cpu);
        let from = prepare(scheduler, cpu);
        if !scheduler.cpus[cpu].exited_stacks.is_empty() {
            STACKS_TO_FREE[cpu].store(true, Ordering::Relaxed);
        }
        trap::mark_leaving(from);
        match scheduler.dequeue(cpu) {
            Some(next) => {
                let (to, stack_top, pid, load, waited) = enter_thread(scheduler, cpu, next, leaving == Some(next));
                (from, to, stack_top, Some((pid, load)), [held, waited])
            }
            None => {
                scheduler.cpus[cpu].current = None;
                (from, trap::idle_slot(cpu), 0, None, [held, None])
            }
        }
    });
    notes.into_iter().for_each(stalls::log_note);
    if from != to {
        // The leaving thread's vector registers go to its save area while its address space
        // is loaded (`fpu`: in ring 3 on PVM; an exiting thread has none), the next one's
        // come back once its context is complete: both in one go within one address space.
        if to < MAX_THREADS {
            trap::wait_until_saved(to);
        }
        match next_process {
            Some((pid, None)) => {
                fpu::switch_threads(cpu, from, to);
                settle_process(cpu, pid, None);
            }
            Some((pid, load)) => {
                fpu::save_running(cpu);
                settle_process(cpu, pid, load);
                fpu::resume(cpu, to);
            }
            None => {
                fpu::save_running(cpu);
            }
        }
        trap::switch_context(cpu, from, to, stack_top);
    }
    free_exited_stacks(tables::current_cpu());
}

/// Per CPU: a thread that exited there left its kernel stack to free (`free_exited_stacks`),
/// so that the other switches do not take the scheduler's lock again for nothing.
static STACKS_TO_FREE: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

fn free_exited_stacks(cpu: usize) {
    if !STACKS_TO_FREE[cpu].swap(false, Ordering::Relaxed) {
        return;
    }
    let stacks = with_scheduler(|scheduler| core::mem::take(&mut scheduler.cpus[cpu].exited_stacks));
    for stack in stacks {
        pmem::free(stack, KERNEL_STACK_SIZE);
    }
}

/// How long a thread runs before another thread waiting for its CPU gets it.
const QUANTUM_MS: u64 = 10;
/// When the running thread's time slice ends, per CPU (TSC).
static QUANTUM_END: [core::sync::atomic::AtomicU64; MAX_CPUS] = [const { core::sync::atomic::AtomicU64::new(0) }; MAX_CPUS];

/// The tick interrupted a thread in user mode: timed waits of this CPU that have expired end
/// (their threads join the queue); if the time slice is over and another thread waits for
/// this CPU, or the running thread may no longer run here (`set_affinity` from another CPU),
/// the running one goes to the back of a queue; else the timer is set for the next event
/// (`arm_next_event`).
pub fn tick() {
    let cpu = tables::current_cpu();
    stalls::count_tick(cpu);
    park_if_requested(cpu);
    end_job_if_requested(cpu);
    let (slice_over, misplaced) = with_scheduler(|scheduler| {
        expire_timed_waits(scheduler, cpu);
        let over = QUEUED[cpu].load(Ordering::Acquire) != 0 && cpu::read_tsc() >= QUANTUM_END[cpu].load(Ordering::Relaxed);
        let misplaced = scheduler.threads[&scheduler.current(cpu)].affinity & (1 << cpu) == 0;
        if !over && !misplaced {
            arm_next_event(scheduler, cpu);
        }
        (over, misplaced)
    });
    if misplaced {
        requeue_current();
    } else if slice_over {
        yield_now();
    }
}

/// Per CPU: a tick came while the CPU was in the kernel with interrupts on (waiting for the
/// host, or idle), where it is not acted on.
static TICK_MISSED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

/// The tick found this CPU in the kernel: the timer is one-shot and now spent, so the tick is
/// taken again on the way back to user mode (`retake_missed_tick`). Otherwise a thread that
/// waited for the host (an XPMEM attach) and then spins in user mode (UCX's progress loop)
/// would keep the CPU for ever from the threads queued for it.
pub fn tick_missed() {
    TICK_MISSED[tables::current_cpu()].store(true, Ordering::Relaxed);
}

/// On the way back to user mode: if a tick came while in the kernel, the timer fires at once,
/// in user mode, where `tick` acts on it.
pub fn retake_missed_tick() {
    let cpu = tables::current_cpu();
    stalls::count_return(cpu);
    if TICK_MISSED[cpu].swap(false, Ordering::Relaxed) {
        apic::arm_timer(cpu::read_tsc());
    }
}

/// Whether other threads wait for this CPU (a thread waiting for the host should then sleep
/// rather than keep it). Timed waits of this CPU that are due end first: the tick that ends
/// them is not taken while a thread waits for the host in the kernel (interrupts off, or a
/// tick in HLT only noted), so a thread whose sleep ended meanwhile would wait for the CPU
/// until the host answered.
pub fn others_wait_here() -> bool {
    let cpu = tables::current_cpu();
    if cpu::read_tsc() >= NEXT_WAIT_END[cpu].load(Ordering::Relaxed) {
        with_scheduler(|scheduler| {
            expire_timed_waits(scheduler, cpu);
            arm_next_event(scheduler, cpu);
        });
    }
    QUEUED[cpu].load(Ordering::Acquire) != 0
}

/// sched_yield: the next runnable thread of this CPU runs; the current one goes to the back
/// of the queue.
pub fn yield_now() {
    if QUEUED[tables::current_cpu()].load(Ordering::Acquire) == 0 {
        return;
    }
    requeue_current();
}

/// Puts the thread running on `cpu` (the caller) at the end of the queue and gives the CPU
/// up; the caller resumes when a CPU takes it off the queue again.
pub(super) fn requeue_current() {
    leave_cpu(|scheduler, cpu| {
        let current = scheduler.current(cpu);
        scheduler.enqueue(current);
        scheduler.threads[&current].slot
    });
}
