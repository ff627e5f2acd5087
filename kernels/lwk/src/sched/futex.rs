//! Waits and wakes: futex queues, kernel keys, `poll`'s wait, and signals ending waits.

use super::run::leave_cpu;
use super::{apic_id, current_pid, with_scheduler, Scheduler, State, Thread, WaitResult};
use crate::arch::apic;
use crate::arch::tables;
use crate::clock;
use crate::console::log;
use crate::job;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

/// A signal thread `tid` takes arrived: a thread in a wait is woken with `WaitResult::Signal`;
/// any other is told (its next wait ends at once unless it passes delivery first: it may be
/// on its way into a wait), and one running on another CPU is sent a tick IPI, so that it
/// passes through the kernel (and takes the signal) without waiting for its next system call.
/// The signal code calls this after dropping its own lock, and the scheduler never takes
/// that lock, so the two locks are only ever taken signal first.
pub fn interrupt(tid: u64) {
    let cpu = tables::current_cpu();
    let target_cpu = with_scheduler(|scheduler| {
        let thread = scheduler.threads.get_mut(&tid)?;
        if let State::Waiting { .. } = thread.state {
            thread.state = State::Runnable;
            thread.wait_result = WaitResult::Signal;
            scheduler.enqueue(tid);
            return None;
        }
        thread.signal_interrupt = true;
        (thread.cpu != cpu && scheduler.cpus[thread.cpu].current == Some(tid)).then_some(thread.cpu)
    });
    if let Some(apic_id) = target_cpu.and_then(apic_id) {
        apic::send_tick(apic_id);
    }
}

/// Blocks the current thread on the futex word at `address` (of its process's memory, or a
/// kernel address: `wake_kernel_key`) if `still_expected()` holds (checked with the
/// scheduler locked, so no wake is lost in between). Returns `None` if it did not hold;
/// `Interrupted` at once if the thread's process is being killed, `Signal` if a signal the
/// thread takes arrived since it last passed delivery (checked after `still_expected`, as
/// Linux's futex wait checks the word first).
pub fn wait(address: u64, bitset: u32, deadline: Option<u64>, still_expected: impl FnOnce() -> bool) -> Option<WaitResult> {
    wait_as(address, bitset, deadline, false, still_expected)
}

/// As `wait` (any bitset), for what a host message ends (a socket's answer or readiness, a
/// file call's answer, XEMEM's `Notify`): the thread sleeps until the message's wake, and
/// neither its wait nor its job's other threads' count as a dead-lock meanwhile. Such waits
/// once slept in 100 ms slices to stay out of the dead-lock check, so each waiter woke ten
/// times a second, emulated kernel work taken from the threads that run.
pub fn wait_for_host(address: u64, deadline: Option<u64>, still_expected: impl FnOnce() -> bool) -> Option<WaitResult> {
    wait_as(address, u32::MAX, deadline, true, still_expected)
}

fn wait_as(
    address: u64,
    bitset: u32,
    deadline: Option<u64>,
    host_wakes: bool,
    still_expected: impl FnOnce() -> bool,
) -> Option<WaitResult> {
    let mut outcome = None;
    let mut dead_lock = false;
    leave_cpu(|scheduler, cpu| {
        let current = scheduler.current(cpu);
        if scheduler.threads[&current].doomed {
            outcome = Some(WaitResult::Interrupted);
        } else if !still_expected() {
            outcome = None;
        } else if core::mem::take(&mut scheduler.current_thread(cpu).signal_interrupt) {
            outcome = Some(WaitResult::Signal);
        } else {
            let others_all_wait = scheduler
                .threads
                .iter()
                .all(|(&tid, thread)| tid == current || matches!(thread.state, State::Waiting { deadline: None, host_wakes: false, .. }));
            dead_lock = deadline.is_none() && !host_wakes && others_all_wait;
            if !dead_lock {
                if let Some(deadline) = deadline {
                    super::run::note_timed_wait(cpu, deadline);
                }
                let thread = scheduler.current_thread(cpu);
                thread.state = State::Waiting { address, bitset, deadline, host_wakes };
                thread.wait_result = WaitResult::Woken;
                outcome = Some(WaitResult::Woken);
                return thread.slot;
            }
        }
        // Not blocking after all: stay, by running ourselves next.
        scheduler.cpus[cpu].run_queue.push_front(current);
        scheduler.threads[&current].slot
    });
    if dead_lock {
        // Ended outside the scheduler's lock, so that a persistent enclave can reuse it.
        log!("every thread of the job waits on a futex that nobody can wake: dead-lock");
        job::exit(job::killed_status(9));
    }
    // The thread may have been woken onto another CPU.
    let cpu = tables::current_cpu();
    match outcome {
        Some(WaitResult::Woken) => Some(with_scheduler(|scheduler| scheduler.current_thread(cpu).wait_result)),
        other => other,
    }
}

/// Blocks the current thread until a signal it takes or waits for arrives (`Signal`; or
/// `Interrupted` when its process is being killed), or until `deadline` (monotonic ns) if
/// given (`TimedOut`). No futex wake ends this wait: bitset 0 meets no wake's bitset.
pub fn wait_interruptibly(deadline: Option<u64>) -> WaitResult {
    loop {
        match wait(0, 0, deadline, || deadline.is_none_or(|deadline| clock::monotonic_ns() < deadline)) {
            None => return WaitResult::TimedOut,
            Some(WaitResult::Woken) => continue,
            Some(result) => return result,
        }
    }
}

/// Blocks the current thread until a signal it takes arrives (`pause`, `rt_sigsuspend`).
pub fn wait_for_signal() {
    wait_interruptibly(None);
}

/// Blocks the current thread until the monotonic clock reaches `deadline` (ns); false if a
/// signal interrupted the sleep first.
pub fn sleep_until(deadline: u64) -> bool {
    wait_interruptibly(Some(deadline)) == WaitResult::TimedOut
}

/// The current thread passes signal delivery: a signal announced by `interrupt` is taken
/// now, so it no longer ends the thread's next wait.
pub fn clear_signal_interrupt() {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| scheduler.current_thread(cpu).signal_interrupt = false);
}

/// Wakes up to `count` threads of the calling process waiting on `address` whose bitset
/// meets `bitset`.
pub fn wake(address: u64, count: u64, bitset: u32) -> u64 {
    let pid = current_pid();
    with_scheduler(|scheduler| wake_locked(scheduler, |thread| thread.pid == pid, address, count, bitset))
}

/// Wakes every thread waiting on the kernel's key `key` (a kernel address naming what they
/// wait for: a pipe, a process's children), whatever their process; and every thread in
/// `poll` (`wait_for_any_key`), which looks again at what it watches.
pub fn wake_kernel_key(key: u64) {
    wake_kernel_key_for(key, None);
}

/// As `wake_kernel_key`, for an object only job `job`'s threads can watch (its sockets, its
/// pipes): only that job's threads in `poll` look again. Waking every job's pollers for every
/// socket answer and readiness report made each one cost a pass of every poller of every
/// rank sharing the enclave (emulated kernel work on PVM): four ranks spent their CPUs so
/// and never got through `MPI_Init`.
pub fn wake_kernel_key_for(key: u64, job: Option<u32>) {
    with_scheduler(|scheduler| {
        wake_locked(scheduler, |_| true, key, u64::MAX, u32::MAX);
        if POLLERS.load(Ordering::Relaxed) != 0 {
            wake_locked(scheduler, |thread| job.is_none_or(|job| thread.job == job), poll_key(), u64::MAX, u32::MAX);
        }
    });
}

/// As `wake_kernel_key`, without the pollers: for what no `poll` watches (a file call's answer).
pub fn wake_kernel_key_only(key: u64) {
    with_scheduler(|scheduler| wake_locked(scheduler, |_| true, key, u64::MAX, u32::MAX));
}

/// Threads waiting in `wait_for_any_key` (so that other wakes skip a second scan without them).
static POLLERS: AtomicUsize = AtomicUsize::new(0);
static POLL_KEY: u8 = 0;

fn poll_key() -> u64 {
    &POLL_KEY as *const u8 as u64
}

/// `poll`'s wait: as `wait`, but any kernel key's wake ends it (the caller looks again at
/// every object it watches: pipes and XEMEM notifiers wake their kernel keys when they
/// change). `still_expected` (nothing ready) is checked with the scheduler locked.
/// `host_wakes`: a host message may make something ready (`wait_for_host`).
pub fn wait_for_any_key(deadline: Option<u64>, host_wakes: bool, still_expected: impl FnOnce() -> bool) -> Option<WaitResult> {
    POLLERS.fetch_add(1, Ordering::Relaxed);
    let result = wait_as(poll_key(), u32::MAX, deadline, host_wakes, still_expected);
    POLLERS.fetch_sub(1, Ordering::Relaxed);
    result
}

/// Wakes up to `count` threads that `whose` accepts waiting on `address` for a bitset that
/// meets `bitset`.
fn wake_locked(scheduler: &mut Scheduler, whose: impl Fn(&Thread) -> bool, address: u64, count: u64, bitset: u32) -> u64 {
    let waiting: Vec<u64> = scheduler
        .threads
        .iter()
        .filter(|(_, thread)| whose(thread))
        .filter(|(_, thread)| matches!(thread.state, State::Waiting { address: on, bitset: wanted, .. } if on == address && wanted & bitset != 0))
        .map(|(&tid, _)| tid)
        .take(count as usize)
        .collect();
    for &tid in &waiting {
        scheduler.threads.get_mut(&tid).expect("waiting thread").state = State::Runnable;
        scheduler.enqueue(tid);
    }
    waiting.len() as u64
}

/// FUTEX_REQUEUE: wakes up to `wake_count` waiters of `from` and moves up to `move_count`
/// of the others to `to`.
pub fn requeue(from: u64, to: u64, wake_count: u64, move_count: u64) -> u64 {
    let pid = current_pid();
    with_scheduler(|scheduler| {
        let woken = wake_locked(scheduler, |thread| thread.pid == pid, from, wake_count, u32::MAX);
        let mut moved = 0;
        for thread in scheduler.threads.values_mut().filter(|thread| thread.pid == pid) {
            if moved == move_count {
                break;
            }
            if let State::Waiting { address, bitset, deadline, host_wakes } = thread.state {
                if address == from {
                    thread.state = State::Waiting { address: to, bitset, deadline, host_wakes };
                    moved += 1;
                }
            }
        }
        woken + moved
    })
}
