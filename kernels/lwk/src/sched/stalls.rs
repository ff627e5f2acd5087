//! Stall notes: the enclave's log (`clowder logs`) gets a line for each thread that waited
//! long in a run queue and for each run that kept a CPU long while others waited, with the
//! CPU's queue length. Issue 25's four MPI ranks in one enclave stalled for over a second at
//! times, past PMIx's 2 s finalize timer; these lines say which thread waited, on which CPU,
//! and who had the CPU meanwhile. Measured under the scheduler's lock, logged after it.
//!
//! A run's note counts only the time since the first of those waiting joined the queue, and
//! the returns to user mode and ticks of that time: it once counted the whole run, so a
//! spinner that ran alone for seconds (tickless, rightly) and was then preempted by the
//! first tick after a thread woke beside it was noted as "kept cpu 0 10529 ms while 1 waited
//! (213 returns to user mode, 1 ticks there)", which read as lost ticks
//! (kernels/lwk/tests/slice-ticks.sh).
//!
//! At most `NOTES_PER_WINDOW` notes go out in `NOTE_WINDOW_NS` (`lwk_core::ratelimit`); the
//! next note after a quiet spell says how many were left out. Each note is emulated console
//! output on PVM, and an overloaded enclave noted so much that the notes slowed it further.

use super::{Scheduler, Thread, QUEUED};
use crate::arch::sync::SpinLock;
use crate::arch::tables::MAX_CPUS;
use crate::clock;
use crate::console::log;
use core::sync::atomic::{AtomicU64, Ordering};
use lwk_core::ratelimit::{LogBudget, Verdict};

/// A wait or a run at least this long is noted.
const STALL_NS: u64 = 500_000_000;
/// Linux's default printk limit is 10 lines in 5 s; notes come from every CPU of a loaded
/// enclave, so the same 10 in a longer window.
const NOTES_PER_WINDOW: u32 = 10;
const NOTE_WINDOW_NS: u64 = 30_000_000_000;
static BUDGET: SpinLock<LogBudget> = SpinLock::new(LogBudget::new(NOTES_PER_WINDOW, NOTE_WINDOW_NS));

pub(super) enum Note {
    /// Thread `tid` waited `waited_ns` in `cpu`'s queue, `queued` others with it.
    Waited { cpu: usize, tid: u64, job: u32, waited_ns: u64, queued: usize },
    /// Thread `tid` kept `cpu` for `held_ns` of a run of `ran_ns` while threads waited there
    /// (`queued` at the end), returning to user mode `returns` times and taking `ticks` ticks
    /// there while any waited.
    Held { cpu: usize, tid: u64, job: u32, held_ns: u64, ran_ns: u64, queued: usize, returns: u64, ticks: u64 },
}

/// Per CPU, in its current thread's run while others wait for the CPU: returns to user mode
/// from the kernel, and ticks taken in user mode. Whether a long hold was one long stay in
/// the kernel or user code the ticks did not reach.
static RETURNS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static TICKS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// A return to user mode on `cpu` (the caller's).
pub(super) fn count_return(cpu: usize) {
    count(&RETURNS, cpu);
}

/// A tick on `cpu` (the caller's).
pub(super) fn count_tick(cpu: usize) {
    count(&TICKS, cpu);
}

fn count(counts: &[AtomicU64; MAX_CPUS], cpu: usize) {
    if QUEUED[cpu].load(Ordering::Relaxed) != 0 {
        counts[cpu].fetch_add(1, Ordering::Relaxed);
    }
}

/// The note for `thread` (`next`), taken off `cpu`'s queue (`queued` left there) to run at
/// `now` (`clock::monotonic_ns`), if it waited long.
pub(super) fn on_enter(thread: &Thread, cpu: usize, next: u64, queued: usize, now: u64) -> Option<Note> {
    RETURNS[cpu].store(0, Ordering::Relaxed);
    TICKS[cpu].store(0, Ordering::Relaxed);
    let waited_ns = now.saturating_sub(thread.queued_at);
    (thread.queued_at != 0 && waited_ns >= STALL_NS).then_some(Note::Waited { cpu, tid: next, job: thread.job, waited_ns, queued })
}

/// The note for `cpu`'s current thread leaving it after a run of `ran_ns`, if the threads
/// queued there waited long for it: since the first of them joined the queue (or the run
/// began, if later).
pub(super) fn on_leave(scheduler: &Scheduler, cpu: usize, ran_ns: u64) -> Option<Note> {
    // A short run holds nobody long: no walk of the queue (emulated work at every switch).
    if ran_ns < STALL_NS {
        return None;
    }
    let tid = scheduler.cpus[cpu].current?;
    let queue = &scheduler.cpus[cpu].run_queue;
    let first_queued = queue.iter().filter_map(|waiting| scheduler.threads.get(waiting)).map(|thread| thread.queued_at).min()?;
    let held_ns = ran_ns.min(clock::monotonic_ns().saturating_sub(first_queued));
    (held_ns >= STALL_NS).then(|| Note::Held {
        cpu,
        tid,
        job: scheduler.threads[&tid].job,
        held_ns,
        ran_ns,
        queued: queue.len(),
        returns: RETURNS[cpu].load(Ordering::Relaxed),
        ticks: TICKS[cpu].load(Ordering::Relaxed),
    })
}

pub(super) fn log_note(note: Option<Note>) {
    let Some(note) = note else { return };
    let verdict = BUDGET.lock().admit(clock::monotonic_ns());
    let Verdict::Log { left_out } = verdict else { return };
    if left_out != 0 {
        log!("stall: {left_out} more notes were left out (at most {NOTES_PER_WINDOW} in {} s)", NOTE_WINDOW_NS / 1_000_000_000);
    }
    match note {
        Note::Waited { cpu, tid, job, waited_ns, queued } => {
            log!("stall: thread {tid} (job {job}) waited {} ms for cpu {cpu} ({queued} more queued there)", waited_ns / 1_000_000)
        }
        Note::Held { cpu, tid, job, held_ns, ran_ns, queued, returns, ticks } => log!(
            "stall: thread {tid} (job {job}) kept cpu {cpu} {} ms while {queued} waited (a run of {} ms; meanwhile {returns} returns to user mode, {ticks} ticks there)",
            held_ns / 1_000_000,
            ran_ns / 1_000_000
        ),
    }
}
