//! Threads of the job and their scheduling, Kitten-style: every CPU has its own run queue,
//! round-robin; a CPU switches only when its running thread blocks (futex), yields or exits.
//! No timer ticks: a thread that owns its CPU is never interrupted. A CPU with nothing to
//! run polls its queue in its idle loop.
//!
//! Placement: a new thread goes to the online CPU with the fewest threads (the lowest index
//! on ties). So does a forked process's first thread. Threads move to balance the CPUs
//! (`Scheduler::place`): a thread that becomes runnable (woken, or at the end of its time
//! slice) goes to a CPU it may run on with fewer threads running or queued than its own.
//! Without that, ranks sharing an enclave piled up on one CPU for good (hwloc binds each to
//! every CPU in turn and then to all, which left all on the last) while the other idled. A
//! CPU that runs out of threads does not take one queued elsewhere: with that stealing, jobs
//! of a two-CPU persistent enclave died of SIGSEGV or stopped the kernel (a kernel fetch at a
//! user address, a corrupt thread map) within a few dozen short threaded/forking jobs, and
//! never without it (cli-test persistent_enclave).
//!
//! Threads belong to processes (`pid`), each with its address space: a CPU writes CR3 only
//! when the next thread's address space differs from the one it has loaded, and loads the
//! kernel's own tables when it goes idle, so that a process's tables can be freed as soon as
//! its last thread is gone. A process being killed (`doom_process`) loses its threads that
//! are not running at once; a running one is marked and leaves at its next return to user
//! mode (a tick IPI brings it there).

mod futex;
mod job_end;
mod park;
mod report;
mod run;
mod stalls;
mod tlb;

pub use futex::{
    clear_signal_interrupt, interrupt, requeue, sleep_until, wait, wait_for_any_key, wait_for_host, wait_for_signal, wait_interruptibly,
    wake, wake_kernel_key, wake_kernel_key_for, wake_kernel_key_only,
};
pub use job_end::{clear_job_end_request, end_job_if_requested, hand_job_end_to_cpu0, release_job_threads};
pub use park::{cpu_tables_ready, join_cpu, mark_cpu_tables_ready, park_if_requested, park_other_cpus, wait_for_cpus};
pub use report::log_job_threads;
pub use run::{others_wait_here, retake_missed_tick, tick, tick_missed, yield_now};
pub use tlb::{flush_tlb_if_stale, shoot_down_user_tlbs, start_user_tlb_shootdown};

use crate::arch::apic;
use crate::arch::cpu::{self, MSR_FS_BASE, MSR_GS_BASE};
use crate::arch::fpu;
use crate::arch::paging::PAGE_SIZE;
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::arch::tables::{self, MAX_CPUS};
use crate::arch::trap::{self, TrapFrame, KERNEL_STACK_SIZE, MAX_THREADS};
use crate::clock;
use crate::job;
use crate::mm::pmem;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use job_end::{JOB_END_REQUEST, NO_END_REQUEST};
use lwk_core::ids::{IdBlock, IDS_PER_BLOCK};
use park::{bring_back_parked_cpus, CPUS_RELEASED};
use run::{idle_entry, leave_cpu};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Runnable,
    /// Waiting on the futex word at `address` for a wake whose bitset meets `bitset`, until
    /// `deadline` (monotonic ns) if it has one. `host_wakes`: a host message may end the wait
    /// (`wait_for_host`), so it is never part of a dead-lock.
    Waiting {
        address: u64,
        bitset: u32,
        deadline: Option<u64>,
        host_wakes: bool,
    },
}

/// How a wait ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WaitResult {
    Woken,
    TimedOut,
    /// The thread's process is being killed: it must return to user mode, where it ends.
    Interrupted,
    /// A signal the thread takes (or waits for) arrived (`crate::signal`): the call ends
    /// (or restarts) so that the thread can take it.
    Signal,
}

struct Thread {
    /// Its process.
    pid: u64,
    /// Its process's enclave job (`crate::enclave`; 0 for a boot module's job).
    job: u32,
    /// Its process's address space: id (never reused) and root table.
    aspace: (u64, u64),
    /// Its process is being killed: it ends at its next return to user mode.
    doomed: bool,
    /// A signal the thread takes arrived while it was not waiting (`interrupt`): its next
    /// wait ends at once, unless it passes signal delivery first.
    signal_interrupt: bool,
    /// In `exit_current`: no longer counts as one of its process's live threads.
    exiting: bool,
    /// The CPU the thread runs on.
    cpu: usize,
    /// The CPUs it may run on (`sched_setaffinity`; bit n for CPU n).
    affinity: u64,
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
    /// The time it ran before its current run (`run::RUN_START`), in ns.
    cpu_time_ns: u64,
    /// When it last joined a run queue (`clock::monotonic_ns`; 0: never), for `stalls`.
    queued_at: u64,
}

#[derive(Default)]
struct Cpu {
    /// The running thread; `None` while the idle loop runs.
    current: Option<u64>,
    run_queue: VecDeque<u64>,
    /// Kernel stacks of threads that exited here, freed once this CPU has left them.
    exited_stacks: Vec<u64>,
}

struct Scheduler {
    threads: BTreeMap<u64, Thread>,
    cpus: Vec<Cpu>,
    /// The ids new threads and forked processes take (this enclave's block, `lwk_core::ids`).
    ids: IdBlock,
    free_slots: Vec<usize>,
}

static SCHEDULER: SpinLock<Option<Scheduler>> = SpinLock::new(None);
/// The enclave's block of ids, each job numbering from its start (`use_id_block`).
static ID_BLOCK: SpinLock<IdBlock> = SpinLock::new(IdBlock::ZERO);
/// Each CPU's run-queue length, for its idle loop to poll without taking the lock, and for
/// sched_yield in ring 3 (kept in the fast calls' data page, `arch::fastcall`).
static QUEUED: &[AtomicUsize; MAX_CPUS] = &crate::arch::fastcall::DATA.queued;
/// Each CPU's running process (the pid of its current or last thread).
static CURRENT_PID: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Each CPU's running job (the enclave job of its current or last thread): which job a
/// console write, file or socket call is for, read without a lock.
static CURRENT_JOB: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
/// Each CPU's loaded address space (`AddressSpace` id; 0: the kernel's tables).
static LOADED_ASPACE: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Threads marked to end (`doom_process`) that have not yet: the system-call exit path takes
/// the full trap path while there are some.
static DOOMED_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Thread `tid`'s CPU time in ns (its runs so far and the current one, kernel time included)
/// and its process, if it exists.
pub fn thread_cpu_time(tid: u64) -> Option<(u64, u64)> {
    with_scheduler(|scheduler| {
        let thread = scheduler.threads.get(&tid)?;
        let running = scheduler.cpus[thread.cpu].current == Some(tid);
        let this_run = if running { clock::monotonic_ns().saturating_sub(run::RUN_START[thread.cpu].load(Ordering::Relaxed)) } else { 0 };
        Some((thread.pid, thread.cpu_time_ns + this_run))
    })
}

/// The process of the thread running on this CPU.
pub fn current_pid() -> u64 {
    CURRENT_PID[tables::current_cpu()].load(Ordering::Relaxed)
}

/// The enclave job of the thread running on this CPU.
pub fn current_job() -> u32 {
    CURRENT_JOB[tables::current_cpu()].load(Ordering::Relaxed)
}

pub fn doomed_threads_exist() -> bool {
    DOOMED_THREADS.load(Ordering::Acquire) != 0
}

/// Whether the thread running here is marked to end (cheap while no thread is).
pub fn current_thread_doomed() -> bool {
    let cpu = tables::current_cpu();
    doomed_threads_exist()
        && SCHEDULER.lock().as_ref().is_some_and(|scheduler| {
            scheduler.cpus[cpu].current.and_then(|tid| scheduler.threads.get(&tid)).is_some_and(|thread| thread.doomed)
        })
}

/// Loads the kernel's own tables on this CPU (it runs no process now).
pub fn use_kernel_tables(cpu: usize) {
    crate::mm::activate_kernel_tables();
    LOADED_ASPACE[cpu].store(0, Ordering::Release);
}

/// Whether any CPU other than this one has the address space `id` loaded.
fn loaded_elsewhere(id: u64) -> bool {
    let cpu = tables::current_cpu();
    (0..MAX_CPUS).any(|other| other != cpu && LOADED_ASPACE[other].load(Ordering::Acquire) == id)
}

/// Waits until no other CPU has address space `id` loaded: its last threads are gone, and
/// the CPUs that ran them switch away (to another thread, or to the kernel's tables when
/// idle) within a few instructions.
pub fn wait_until_unloaded(id: u64) {
    while loaded_elsewhere(id) {
        core::hint::spin_loop();
    }
}

/// Each CPU's local APIC id (`NO_APIC` without x2APIC): the address of its wake-up IPI.
static APIC_IDS: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(NO_APIC) }; MAX_CPUS];
const NO_APIC: u32 = u32::MAX;

/// Records how to wake `cpu` when it sleeps (its x2APIC id), or that it cannot sleep.
pub fn set_apic_id(cpu: usize, apic_id: Option<u32>) {
    APIC_IDS[cpu].store(apic_id.unwrap_or(NO_APIC), Ordering::Relaxed);
}

fn apic_id(cpu: usize) -> Option<u32> {
    Some(APIC_IDS[cpu].load(Ordering::Relaxed)).filter(|&id| id != NO_APIC)
}

fn with_scheduler<R>(f: impl FnOnce(&mut Scheduler) -> R) -> R {
    f(SCHEDULER.lock().as_mut().expect("no job threads yet"))
}

impl Scheduler {
    fn current(&self, cpu: usize) -> u64 {
        self.cpus[cpu].current.expect("a thread runs on this CPU")
    }

    fn current_thread(&mut self, cpu: usize) -> &mut Thread {
        let tid = self.current(cpu);
        self.threads.get_mut(&tid).expect("current thread")
    }

    fn enqueue(&mut self, tid: u64) {
        let cpu = self.place(tid);
        self.threads.get_mut(&tid).expect("runnable thread").queued_at = clock::monotonic_ns();
        let first_waiting = self.cpus[cpu].run_queue.is_empty();
        self.cpus[cpu].run_queue.push_back(tid);
        QUEUED[cpu].store(self.cpus[cpu].run_queue.len(), Ordering::Release);
        let here = cpu == tables::current_cpu();
        match (self.cpus[cpu].current, here) {
            // An idle CPU may be asleep in HLT.
            (None, false) => {
                if let Some(apic_id) = apic_id(cpu) {
                    apic::send_wake(apic_id);
                }
            }
            // A busy CPU that had nobody waiting starts time-slicing.
            (Some(_), false) if first_waiting => {
                if let Some(apic_id) = apic_id(cpu) {
                    apic::send_tick(apic_id);
                }
            }
            (Some(_), true) if first_waiting => run::arm_next_event(self, cpu),
            _ => {}
        }
    }

    /// The next thread for `cpu`: the first of its own queue (see the module comment for why
    /// not one queued elsewhere).
    fn dequeue(&mut self, cpu: usize) -> Option<u64> {
        let next = self.cpus[cpu].run_queue.pop_front();
        QUEUED[cpu].store(self.cpus[cpu].run_queue.len(), Ordering::Release);
        next
    }

    /// Where runnable thread `tid` is to wait: its own CPU, unless another CPU it may run on
    /// has fewer threads (running or queued, itself not counted), to which it moves, or its
    /// affinity no longer allows its CPU (`set_affinity`), when it moves to the least busy
    /// CPU it may run on. Threads move so at every wake-up and time slice's end: no CPU takes
    /// threads queued on another (see the module comment), and without this, threads woken on
    /// a CPU whose running thread spins (an MPI rank waiting for a message) piled up there,
    /// nine behind one while the other CPU ran one spinner alone: waits of tens of seconds.
    fn place(&mut self, tid: u64) -> usize {
        let home = self.threads[&tid].cpu;
        let allowed = online_cpu_mask() & self.threads[&tid].affinity;
        let load = |cpu: usize| self.cpus[cpu].run_queue.len() + self.cpus[cpu].current.is_some_and(|running| running != tid) as usize;
        let home_load = (allowed & (1 << home) != 0).then(|| load(home));
        let least = cpus_in(allowed).min_by_key(|&cpu| (load(cpu), cpu));
        let target = match (home_load, least) {
            (Some(home_load), Some(cpu)) if load(cpu) < home_load => cpu,
            (Some(_), _) => home,
            // Its mask has no online CPU left (set_affinity refuses that): it stays.
            (None, least) => least.unwrap_or(home),
        };
        self.threads.get_mut(&tid).expect("runnable thread").cpu = target;
        target
    }
}

/// Records the job's main thread (tid = pid), running on CPU 0 on the boot trap stack in
/// address space `aspace` (loaded), and lets the other CPUs join.
pub fn init_main_thread(pid: u64, aspace: (u64, u64), job_id: u32) {
    let main = Thread {
        pid,
        job: job_id,
        aspace,
        doomed: false,
        signal_interrupt: false,
        exiting: false,
        cpu: 0,
        affinity: u64::MAX,
        slot: 0,
        stack_top: tables::trap_stack_top(),
        stack_physical: None,
        state: State::Runnable,
        wait_result: WaitResult::Woken,
        fs_base: 0,
        gs_base: 0,
        clear_child_tid: 0,
        cpu_time_ns: 0,
        queued_at: 0,
    };
    // CPU 0 booted on a stack it has left; its idle loop gets a stack of its own, kept for
    // every later job (nothing runs on it between jobs).
    let mut idle_stack = CPU0_IDLE_STACK.load(Ordering::Relaxed);
    if idle_stack == 0 {
        idle_stack = pmem::allocate(KERNEL_STACK_SIZE, PAGE_SIZE).expect("no memory for the idle stack");
        CPU0_IDLE_STACK.store(idle_stack, Ordering::Relaxed);
    }
    trap::prepare_kernel_context(trap::idle_slot(0), phys::to_virtual(idle_stack) + KERNEL_STACK_SIZE, idle_entry);
    let mut threads = BTreeMap::new();
    threads.insert(pid, main);
    let mut cpus: Vec<Cpu> = (0..MAX_CPUS).map(|_| Cpu::default()).collect();
    cpus[0].current = Some(pid);
    *SCHEDULER.lock() = Some(Scheduler { threads, cpus, ids: *ID_BLOCK.lock(), free_slots: (1..MAX_THREADS).rev().collect() });
    ONLINE_CPUS.store(1, Ordering::Release);
    for queued in QUEUED {
        queued.store(0, Ordering::Release);
    }
    CURRENT_PID[0].store(pid, Ordering::Relaxed);
    CURRENT_JOB[0].store(job_id, Ordering::Relaxed);
    crate::arch::fastcall::job_started(pid);
    run::start_run(0, 0);
    LOADED_ASPACE[0].store(aspace.0, Ordering::Release);
    fpu::start_first_thread(0, 0);
    DOOMED_THREADS.store(0, Ordering::Release);
    JOB_END_REQUEST.store(NO_END_REQUEST, Ordering::Release);
    CPUS_RELEASED.store(true, Ordering::Release);
    bring_back_parked_cpus();
}

/// CPU 0's idle stack (physical), allocated with the first job.
static CPU0_IDLE_STACK: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub enum AffinityError {
    NoSuchThread,
    NoOnlineCpu,
}

/// Lets thread `tid` run on the CPUs of `mask` only. A thread whose CPU the mask leaves out
/// moves to one it allows: the caller at once, a queued thread now (`Scheduler::place`), a
/// waiting one when it is woken, and one running on another CPU at that CPU's next tick,
/// which this sends (`tick`). Until it moves, a thread's recorded CPU stays the one it is on:
/// a kill's tick, timed waits and the CPU-time report go by it.
pub fn set_affinity(tid: u64, mask: u64) -> Result<(), AffinityError> {
    let caller_cpu = tables::current_cpu();
    let action = with_scheduler(|scheduler| {
        if mask & online_cpu_mask() == 0 {
            return Err(AffinityError::NoOnlineCpu);
        }
        let thread = scheduler.threads.get_mut(&tid).ok_or(AffinityError::NoSuchThread)?;
        thread.affinity = mask;
        let home = thread.cpu;
        if mask & (1 << home) != 0 {
            return Ok(AffinityMove::None);
        }
        if scheduler.cpus[home].current == Some(tid) {
            return Ok(if home == caller_cpu { AffinityMove::Caller } else { AffinityMove::Tick(home) });
        }
        if let Some(position) = scheduler.cpus[home].run_queue.iter().position(|&queued| queued == tid) {
            scheduler.cpus[home].run_queue.remove(position);
            QUEUED[home].store(scheduler.cpus[home].run_queue.len(), Ordering::Release);
            scheduler.enqueue(tid);
        }
        Ok(AffinityMove::None)
    })?;
    match action {
        // We resume on a CPU the mask allows.
        AffinityMove::Caller => run::requeue_current(),
        AffinityMove::Tick(cpu) => {
            if let Some(apic_id) = apic_id(cpu) {
                apic::send_tick(apic_id);
            }
        }
        AffinityMove::None => {}
    }
    Ok(())
}

/// What `set_affinity` does once the scheduler's lock is dropped.
enum AffinityMove {
    None,
    /// The caller runs on a CPU its new mask leaves out.
    Caller,
    /// The thread runs on that CPU, which its new mask leaves out.
    Tick(usize),
}

pub fn thread_count() -> usize {
    with_scheduler(|scheduler| scheduler.threads.len())
}

/// The CPUs whose bits are set in `mask`, lowest first: one step per set bit, not per possible
/// CPU.
fn cpus_in(mut mask: u64) -> impl Iterator<Item = usize> {
    core::iter::from_fn(move || {
        (mask != 0).then(|| {
            let index = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            index
        })
    })
}

/// Bit n set for each online CPU n.
pub fn online_cpu_mask() -> u64 {
    ONLINE_CPUS.load(Ordering::Acquire)
}

/// Bit n set while CPU n runs the job's threads: CPU 0 from the scheduler's creation, the
/// others as they join; cleared with the scheduler. An atomic, not a field under the
/// scheduler's lock, so the per-detach TLB shootdown reads it in one instruction.
static ONLINE_CPUS: AtomicU64 = AtomicU64::new(0);

pub fn current_tid() -> u64 {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| scheduler.current(cpu))
}

pub fn set_clear_child_tid(address: u64) {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| scheduler.current_thread(cpu).clear_child_tid = address);
}

/// The current thread's FS base (its TLS pointer).
pub fn current_fs_base() -> u64 {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| scheduler.current_thread(cpu).fs_base)
}

pub fn set_fs_base(base: u64) {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| scheduler.current_thread(cpu).fs_base = base);
    cpu::write_msr(MSR_FS_BASE, base);
}

pub fn set_gs_base(base: u64) {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| scheduler.current_thread(cpu).gs_base = base);
    cpu::write_msr(MSR_GS_BASE, base);
}

#[derive(Debug)]
pub enum SpawnError {
    TooManyThreads,
    NoMemory,
}

/// A new thread of the calling process that starts in user mode with `frame`, on the least
/// loaded CPU.
pub fn spawn(frame: &TrapFrame, fs_base: u64, clear_child_tid: u64) -> Result<u64, SpawnError> {
    spawn_in(frame, fs_base, clear_child_tid, None)
}

/// Threads and forked processes number from `block` (clowderd's `lwk.id_block`, read at boot).
pub fn use_id_block(block: IdBlock) {
    *ID_BLOCK.lock() = block;
}

/// An id no thread or process has: a process forked with it as its pid gets it as its first
/// thread's id (`spawn_process`). `None` when every id of the enclave's block is in use.
pub fn reserve_tid() -> Option<u64> {
    for _ in 0..IDS_PER_BLOCK {
        let id = with_scheduler(|scheduler| scheduler.ids.take(|id| scheduler.threads.contains_key(&id)))?;
        // A process outlives its threads until it is waited for; the process table is not
        // taken under the scheduler's lock.
        if !crate::process::exists(id) {
            return Some(id);
        }
    }
    None
}

/// The first thread of the new process `pid` (a `reserve_tid`), forked by the caller, whose
/// address space is `aspace`.
pub fn spawn_process(pid: u64, frame: &TrapFrame, fs_base: u64, clear_child_tid: u64, aspace: (u64, u64)) -> Result<u64, SpawnError> {
    spawn_in(frame, fs_base, clear_child_tid, Some((pid, aspace)))
}

/// The first thread of process `pid` (a `reserve_tid`), the first of enclave job `job_id`
/// launched beside running jobs: it has no creator (initial vector state, no GS base) and
/// goes to the least loaded CPU.
pub fn spawn_job_leader(pid: u64, job_id: u32, frame: &TrapFrame, aspace: (u64, u64)) -> Result<u64, SpawnError> {
    spawn_thread(frame, 0, 0, Some((pid, aspace)), Some(job_id))
}

fn spawn_in(frame: &TrapFrame, fs_base: u64, clear_child_tid: u64, new_process: Option<(u64, (u64, u64))>) -> Result<u64, SpawnError> {
    spawn_thread(frame, fs_base, clear_child_tid, new_process, None)
}

/// A new thread (of the caller's job, or the first of job `new_job`, which has no creator).
fn spawn_thread(
    frame: &TrapFrame,
    fs_base: u64,
    clear_child_tid: u64,
    new_process: Option<(u64, (u64, u64))>,
    new_job: Option<u32>,
) -> Result<u64, SpawnError> {
    let tid = match new_process {
        Some((pid, _)) => pid,
        None => reserve_tid().ok_or(SpawnError::TooManyThreads)?,
    };
    let stack_physical = pmem::allocate(KERNEL_STACK_SIZE, PAGE_SIZE).ok_or(SpawnError::NoMemory)?;
    let stack_top = phys::to_virtual(stack_physical) + KERNEL_STACK_SIZE;
    let caller_cpu = tables::current_cpu();
    // The new thread starts with its creator's vector registers, as on Linux.
    let creator_state = if new_job.is_none() { fpu::save_running(caller_cpu) } else { None };
    let result = with_scheduler(|scheduler| {
        let slot = scheduler.free_slots.pop().ok_or(SpawnError::TooManyThreads)?;
        let mut load = [0usize; MAX_CPUS];
        for thread in scheduler.threads.values() {
            load[thread.cpu] += 1;
        }
        let cpu = cpus_in(online_cpu_mask()).min_by_key(|&cpu| (load[cpu], cpu)).unwrap_or(0);
        // A thread created by one whose process is being killed (`doom_process` came while
        // its creator was in `clone`) ends with it; a forked process is killed by
        // `process::fork` instead.
        let (pid, aspace, job, gs_base, doomed) = match (new_process, new_job) {
            (Some((pid, aspace)), Some(job)) => (pid, aspace, job, 0, false),
            _ => {
                let caller = scheduler.current_thread(caller_cpu);
                let (pid, aspace) = new_process.unwrap_or((caller.pid, caller.aspace));
                (pid, aspace, caller.job, caller.gs_base, caller.doomed && new_process.is_none())
            }
        };
        if doomed {
            DOOMED_THREADS.fetch_add(1, Ordering::AcqRel);
        }
        trap::prepare_thread(slot, stack_top, frame);
        fpu::inherit(slot, creator_state);
        let thread = Thread {
            pid,
            job,
            aspace,
            doomed,
            signal_interrupt: false,
            exiting: false,
            cpu,
            affinity: u64::MAX,
            slot,
            stack_top,
            stack_physical: Some(stack_physical),
            state: State::Runnable,
            wait_result: WaitResult::Woken,
            fs_base,
            gs_base,
            clear_child_tid,
            cpu_time_ns: 0,
            queued_at: 0,
        };
        scheduler.threads.insert(tid, thread);
        scheduler.enqueue(tid);
        Ok(tid)
    });
    if result.is_err() {
        pmem::free(stack_physical, KERNEL_STACK_SIZE);
    }
    result
}

/// `execve` replaced the calling thread's address space: it runs in `aspace` from now on.
pub fn switch_current_aspace(aspace: (u64, u64)) {
    let cpu = tables::current_cpu();
    with_scheduler(|scheduler| {
        let thread = scheduler.current_thread(cpu);
        thread.aspace = aspace;
        thread.fs_base = 0;
        thread.clear_child_tid = 0;
    });
    crate::arch::paging::activate_root(aspace.1);
    LOADED_ASPACE[cpu].store(aspace.0, Ordering::Release);
    cpu::write_msr(MSR_FS_BASE, 0);
}

/// Ends every thread of process `pid` but `spare` (the caller, for `exit_group` and
/// `execve`): each is marked and leaves at its next return to user mode, so that what it
/// holds on its kernel stack (a pipe end it waits on) is let go; a waiting one is woken (its
/// wait ends `Interrupted`), a running one elsewhere is sent a tick. Returns how many there
/// are.
pub fn doom_process(pid: u64, spare: Option<u64>) -> usize {
    let cpu = tables::current_cpu();
    let (victims, running) = with_scheduler(|scheduler| {
        let victims: Vec<u64> =
            scheduler.threads.iter().filter(|&(&tid, thread)| thread.pid == pid && Some(tid) != spare).map(|(&tid, _)| tid).collect();
        let mut running = Vec::new();
        for &tid in &victims {
            let thread = scheduler.threads.get_mut(&tid).expect("victim");
            if !thread.doomed && !thread.exiting {
                thread.doomed = true;
                DOOMED_THREADS.fetch_add(1, Ordering::AcqRel);
            }
            if matches!(thread.state, State::Waiting { .. }) {
                thread.state = State::Runnable;
                thread.wait_result = WaitResult::Interrupted;
                scheduler.enqueue(tid);
            } else if scheduler.cpus[thread.cpu].current == Some(tid) && thread.cpu != cpu {
                running.push(thread.cpu);
            }
        }
        (victims.len(), running)
    });
    trap::request_signal_check(true);
    for &home in &running {
        if let Some(apic_id) = apic_id(home) {
            apic::send_tick(apic_id);
        }
    }
    victims
}

/// Whether process `pid` still has threads.
pub fn has_threads(pid: u64) -> bool {
    thread_count_of(pid) != 0
}

pub fn thread_count_of(pid: u64) -> usize {
    with_scheduler(|scheduler| scheduler.threads.values().filter(|thread| thread.pid == pid).count())
}

/// On the way back to user mode: a thread whose process is being killed ends here.
pub fn exit_if_doomed() {
    let cpu = tables::current_cpu();
    if with_scheduler(|scheduler| scheduler.current_thread(cpu).doomed) {
        exit_current(0)
    }
}

/// Ends the current thread. The last thread of its process ends the process (`status` is its
/// exit code unless it was killed or called `exit_group`); the job's first process ending
/// ends the job.
pub fn exit_current(status: u8) -> ! {
    let cpu = tables::current_cpu();
    let (clear_child_tid, pid, slot) = with_scheduler(|scheduler| {
        let thread = scheduler.current_thread(cpu);
        (thread.clear_child_tid, thread.pid, thread.slot)
    });
    // A thread whose process already ended (`job::with_process`) leaves without touching
    // it: its memory and tables may be gone, and so is what the last thread's end does.
    let process_alive = job::process_exists(pid);
    if !process_alive {
        use_kernel_tables(cpu);
    }
    // What the thread holds in its process goes while the thread still counts as live, so
    // that the process is there: the last of its threads to be marked ending takes it away,
    // and its threads end on several CPUs at once (exit_group, a kill). The vector state
    // area leaves the process, which may live on: the slot's next thread may belong to
    // another process (which saves into it only once it has run, long after the other CPUs
    // have taken the shootdown's IPI).
    if let Some(area) = fpu::thread_ended(cpu, slot) {
        let _ = job::with_process_of(pid, |process| process.memory.aspace.unmap(area, PAGE_SIZE));
        start_user_tlb_shootdown();
    }
    if clear_child_tid != 0 && process_alive {
        // pthread_join waits for this word to become zero.
        let _ = trap::copy_to_user(clear_child_tid, &0u32.to_le_bytes());
        wake(clear_child_tid, 1, u32::MAX);
    }
    let last = with_scheduler(|scheduler| {
        let current = scheduler.current(cpu);
        let thread = scheduler.threads.get_mut(&current).expect("current thread");
        thread.exiting = true;
        if thread.doomed {
            thread.doomed = false;
            DOOMED_THREADS.fetch_sub(1, Ordering::AcqRel);
        }
        process_alive && !scheduler.threads.values().any(|other| other.pid == pid && !other.exiting)
    });
    crate::signal::thread_exited(with_scheduler(|scheduler| scheduler.current(cpu)));
    if last {
        // The job ends (its first process), or the process's memory goes now: off its tables.
        crate::process::last_thread_exited(pid, status);
    } else {
        // This CPU may idle with the process's tables loaded; the process may end meanwhile.
        use_kernel_tables(cpu);
    }
    leave_cpu(|scheduler, cpu| {
        let current = scheduler.current(cpu);
        let thread = scheduler.threads.remove(&current).expect("current thread");
        scheduler.free_slots.push(thread.slot);
        scheduler.cpus[cpu].exited_stacks.extend(thread.stack_physical);
        trap::exit_slot(cpu)
    });
    unreachable!("an exited thread was resumed")
}
