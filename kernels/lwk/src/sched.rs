//! Threads of the job and their scheduling: one run queue, round-robin, switching only when
//! the running thread blocks (futex), yields or exits. No timer ticks: a thread that owns its
//! CPU is never interrupted.

use crate::arch::cpu::{self, MSR_FS_BASE, MSR_GS_BASE};
use crate::arch::paging::PAGE_SIZE;
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::arch::tables;
use crate::arch::trap::{self, TrapFrame, KERNEL_STACK_SIZE, MAX_THREADS};
use crate::clock;
use crate::console::log;
use crate::job;
use crate::mm::pmem;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Runnable,
    /// Waiting on the futex word at `address` for a wake whose bitset meets `bitset`, until
    /// `deadline` (monotonic ns) if it has one.
    Waiting { address: u64, bitset: u32, deadline: Option<u64> },
}

/// How a futex wait ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WaitResult {
    Woken,
    TimedOut,
}

struct Thread {
    /// Kernel context slot (`arch::trap`).
    slot: usize,
    stack_top: u64,
    /// The stack's physical base, for freeing; `None` for the main thread's static stack.
    stack_physical: Option<u64>,
    state: State,
    wait_result: WaitResult,
    fs_base: u64,
    gs_base: u64,
    /// `set_tid_address` / CLONE_CHILD_CLEARTID: zeroed and woken when the thread exits.
    clear_child_tid: u64,
}

struct Scheduler {
    threads: BTreeMap<u64, Thread>,
    run_queue: VecDeque<u64>,
    current: u64,
    next_tid: u64,
    free_slots: Vec<usize>,
    /// Kernel stacks of exited threads, freed once another thread runs.
    exited_stacks: Vec<u64>,
}

static SCHEDULER: SpinLock<Option<Scheduler>> = SpinLock::new(None);

fn with_scheduler<R>(f: impl FnOnce(&mut Scheduler) -> R) -> R {
    f(SCHEDULER.lock().as_mut().expect("no job threads yet"))
}

/// Records the job's main thread (tid = pid), running on the boot trap stack.
pub fn init_main_thread() {
    let main = Thread {
        slot: 0,
        stack_top: tables::trap_stack_top(),
        stack_physical: None,
        state: State::Runnable,
        wait_result: WaitResult::Woken,
        fs_base: 0,
        gs_base: 0,
        clear_child_tid: 0,
    };
    let mut threads = BTreeMap::new();
    threads.insert(job::PID, main);
    *SCHEDULER.lock() = Some(Scheduler {
        threads,
        run_queue: VecDeque::new(),
        current: job::PID,
        next_tid: job::PID + 1,
        free_slots: (1..MAX_THREADS).rev().collect(),
        exited_stacks: Vec::new(),
    });
}

pub fn current_tid() -> u64 {
    with_scheduler(|scheduler| scheduler.current)
}

pub fn set_clear_child_tid(address: u64) {
    with_scheduler(|scheduler| {
        let current = scheduler.current;
        scheduler.threads.get_mut(&current).expect("current thread").clear_child_tid = address;
    });
}

/// The current thread's FS base (its TLS pointer).
pub fn current_fs_base() -> u64 {
    with_scheduler(|scheduler| scheduler.threads[&scheduler.current].fs_base)
}

pub fn set_fs_base(base: u64) {
    with_scheduler(|scheduler| {
        let current = scheduler.current;
        scheduler.threads.get_mut(&current).expect("current thread").fs_base = base;
    });
    cpu::write_msr(MSR_FS_BASE, base);
}

pub fn set_gs_base(base: u64) {
    with_scheduler(|scheduler| {
        let current = scheduler.current;
        scheduler.threads.get_mut(&current).expect("current thread").gs_base = base;
    });
    cpu::write_msr(MSR_GS_BASE, base);
}

#[derive(Debug)]
pub enum SpawnError {
    TooManyThreads,
    NoMemory,
}

/// A new thread that starts in user mode with `frame`; it runs when the current one blocks,
/// yields or exits.
pub fn spawn(frame: &TrapFrame, fs_base: u64, clear_child_tid: u64) -> Result<u64, SpawnError> {
    let stack_physical = pmem::allocate(KERNEL_STACK_SIZE, PAGE_SIZE).ok_or(SpawnError::NoMemory)?;
    let stack_top = phys::to_virtual(stack_physical) + KERNEL_STACK_SIZE;
    let result = with_scheduler(|scheduler| {
        let slot = scheduler.free_slots.pop().ok_or(SpawnError::TooManyThreads)?;
        let tid = scheduler.next_tid;
        scheduler.next_tid += 1;
        let gs_base = scheduler.threads[&scheduler.current].gs_base;
        trap::prepare_thread(slot, stack_top, frame);
        let thread = Thread {
            slot,
            stack_top,
            stack_physical: Some(stack_physical),
            state: State::Runnable,
            wait_result: WaitResult::Woken,
            fs_base,
            gs_base,
            clear_child_tid,
        };
        scheduler.threads.insert(tid, thread);
        scheduler.run_queue.push_back(tid);
        Ok(tid)
    });
    if result.is_err() {
        pmem::free(stack_physical, KERNEL_STACK_SIZE);
    }
    result
}

/// Picks the next thread to run. With nothing runnable but timed waits, waits (spinning on
/// the clock: there is no timer interrupt) for the earliest deadline. With every thread
/// waiting for ever, the job is dead-locked and ends as if killed (SIGKILL).
fn pick_next(scheduler: &mut Scheduler) -> u64 {
    loop {
        if let Some(next) = scheduler.run_queue.pop_front() {
            return next;
        }
        let earliest = scheduler
            .threads
            .iter()
            .filter_map(|(&tid, thread)| match thread.state {
                State::Waiting { deadline: Some(deadline), .. } => Some((deadline, tid)),
                _ => None,
            })
            .min();
        let Some((deadline, tid)) = earliest else {
            log!("every thread of the job waits on a futex that nobody can wake: dead-lock");
            job::exit(128 + 9)
        };
        while clock::monotonic_ns() < deadline {
            core::hint::spin_loop();
        }
        let thread = scheduler.threads.get_mut(&tid).expect("waiting thread");
        thread.state = State::Runnable;
        thread.wait_result = WaitResult::TimedOut;
        scheduler.run_queue.push_back(tid);
    }
}

/// Leaves the CPU to `next` (the current thread's state already says why) and returns when
/// the current thread runs again. `exited_slot` is the slot of a current thread that has
/// just been removed.
fn switch_to(next: u64, exited_slot: Option<usize>) {
    let switch = with_scheduler(|scheduler| {
        let previous = scheduler.current;
        if next == previous {
            return None;
        }
        scheduler.current = next;
        let to = &scheduler.threads[&next];
        cpu::write_msr(MSR_FS_BASE, to.fs_base);
        cpu::write_msr(MSR_GS_BASE, to.gs_base);
        let from_slot = exited_slot.unwrap_or_else(|| scheduler.threads[&previous].slot);
        Some((from_slot, to.slot, to.stack_top))
    });
    if let Some((from, to, stack_top)) = switch {
        trap::switch_thread(from, to, stack_top);
    }
    free_exited_stacks();
}

fn free_exited_stacks() {
    let stacks = with_scheduler(|scheduler| core::mem::take(&mut scheduler.exited_stacks));
    for stack in stacks {
        pmem::free(stack, KERNEL_STACK_SIZE);
    }
}

/// sched_yield: the next runnable thread runs; the current one goes to the back of the queue.
pub fn yield_now() {
    let next = with_scheduler(|scheduler| {
        let next = scheduler.run_queue.pop_front()?;
        let current = scheduler.current;
        scheduler.run_queue.push_back(current);
        Some(next)
    });
    if let Some(next) = next {
        switch_to(next, None);
    }
}

/// Blocks the current thread on the futex word at `address` if `still_expected()` holds
/// (checked with the scheduler locked, so no wake is lost in between).
pub fn wait(address: u64, bitset: u32, deadline: Option<u64>, still_expected: impl FnOnce() -> bool) -> Option<WaitResult> {
    let next = with_scheduler(|scheduler| {
        if !still_expected() {
            return None;
        }
        let current = scheduler.current;
        let thread = scheduler.threads.get_mut(&current).expect("current thread");
        thread.state = State::Waiting { address, bitset, deadline };
        thread.wait_result = WaitResult::Woken;
        Some(pick_next(scheduler))
    })?;
    switch_to(next, None);
    Some(with_scheduler(|scheduler| scheduler.threads[&scheduler.current].wait_result))
}

/// Wakes up to `count` threads waiting on `address` whose bitset meets `bitset`.
pub fn wake(address: u64, count: u64, bitset: u32) -> u64 {
    with_scheduler(|scheduler| wake_locked(scheduler, address, count, bitset))
}

fn wake_locked(scheduler: &mut Scheduler, address: u64, count: u64, bitset: u32) -> u64 {
    let mut woken = 0;
    for (&tid, thread) in scheduler.threads.iter_mut() {
        if woken == count {
            break;
        }
        if let State::Waiting { address: waiting_on, bitset: wanted, .. } = thread.state {
            if waiting_on == address && wanted & bitset != 0 {
                thread.state = State::Runnable;
                scheduler.run_queue.push_back(tid);
                woken += 1;
            }
        }
    }
    woken
}

/// FUTEX_REQUEUE: wakes up to `wake_count` waiters of `from` and moves up to `move_count`
/// of the others to `to`.
pub fn requeue(from: u64, to: u64, wake_count: u64, move_count: u64) -> u64 {
    with_scheduler(|scheduler| {
        let woken = wake_locked(scheduler, from, wake_count, u32::MAX);
        let mut moved = 0;
        for thread in scheduler.threads.values_mut() {
            if moved == move_count {
                break;
            }
            if let State::Waiting { address, bitset, deadline } = thread.state {
                if address == from {
                    thread.state = State::Waiting { address: to, bitset, deadline };
                    moved += 1;
                }
            }
        }
        woken + moved
    })
}

/// Ends the current thread. The last thread's exit ends the job with `status`.
pub fn exit_current(status: u8) -> ! {
    let (clear_child_tid, last) = with_scheduler(|scheduler| {
        let thread = &scheduler.threads[&scheduler.current];
        (thread.clear_child_tid, scheduler.threads.len() == 1)
    });
    if last {
        job::exit(status);
    }
    if clear_child_tid != 0 {
        // pthread_join waits for this word to become zero.
        let _ = trap::copy_to_user(clear_child_tid, &0u32.to_le_bytes());
        wake(clear_child_tid, 1, u32::MAX);
    }
    let (next, slot) = with_scheduler(|scheduler| {
        let current = scheduler.current;
        let thread = scheduler.threads.remove(&current).expect("current thread");
        scheduler.free_slots.push(thread.slot);
        scheduler.exited_stacks.extend(thread.stack_physical);
        (pick_next(scheduler), thread.slot)
    });
    switch_to(next, Some(slot));
    unreachable!("an exited thread was resumed")
}
