//! Threads of the job and their scheduling, Kitten-style: every CPU has its own run queue,
//! round-robin; a CPU switches only when its running thread blocks (futex), yields or exits.
//! No timer ticks: a thread that owns its CPU is never interrupted. A CPU with nothing to
//! run polls its queue in its idle loop.
//!
//! Placement: a new thread goes to the online CPU with the fewest threads (the lowest index
//! on ties) and stays there. So does a forked process's first thread.
//!
//! Threads belong to processes (`pid`), each with its address space: a CPU writes CR3 only
//! when the next thread's address space differs from the one it has loaded, and loads the
//! kernel's own tables when it goes idle, so that a process's tables can be freed as soon as
//! its last thread is gone. A process being killed (`doom_process`) loses its threads that
//! are not running at once; a running one is marked and leaves at its next return to user
//! mode (a tick IPI brings it there).

use crate::arch::apic;
use crate::arch::fpu;
use crate::arch::cpu::{self, MSR_FS_BASE, MSR_GS_BASE};
use crate::arch::paging::PAGE_SIZE;
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::arch::tables::{self, MAX_CPUS};
use crate::arch::trap::{self, TrapFrame, KERNEL_STACK_SIZE, MAX_THREADS};
use crate::clock;
use crate::console::log;
use crate::job;
use crate::mm::pmem;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Runnable,
    /// Waiting on the futex word at `address` for a wake whose bitset meets `bitset`, until
    /// `deadline` (monotonic ns) if it has one.
    Waiting { address: u64, bitset: u32, deadline: Option<u64> },
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
    next_tid: u64,
    free_slots: Vec<usize>,
}

static SCHEDULER: SpinLock<Option<Scheduler>> = SpinLock::new(None);
/// Each CPU's run-queue length, for its idle loop to poll without taking the lock.
static QUEUED: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];
/// Each CPU's running process (the pid of its current or last thread).
static CURRENT_PID: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Each CPU's loaded address space (`AddressSpace` id; 0: the kernel's tables).
static LOADED_ASPACE: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Threads marked to end (`doom_process`) that have not yet: the system-call exit path takes
/// the full trap path while there are some.
static DOOMED_THREADS: AtomicUsize = AtomicUsize::new(0);

/// The process of the thread running on this CPU.
pub fn current_pid() -> u64 {
    CURRENT_PID[tables::current_cpu()].load(Ordering::Relaxed)
}

pub fn doomed_threads_exist() -> bool {
    DOOMED_THREADS.load(Ordering::Acquire) != 0
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

/// Set once the main thread exists: the other CPUs may join.
static CPUS_RELEASED: AtomicBool = AtomicBool::new(false);
/// Set once CPU 0 has filled the shared IDT: the other CPUs may load their tables.
static CPU_TABLES_READY: AtomicBool = AtomicBool::new(false);

pub fn mark_cpu_tables_ready() {
    CPU_TABLES_READY.store(true, Ordering::Release);
}

pub fn cpu_tables_ready() -> bool {
    CPU_TABLES_READY.load(Ordering::Acquire)
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
        let cpu = self.threads[&tid].cpu;
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
            (Some(_), true) if first_waiting => apic::arm_timer(QUANTUM_END[cpu].load(Ordering::Relaxed)),
            _ => {}
        }
    }

    fn dequeue(&mut self, cpu: usize) -> Option<u64> {
        let next = self.cpus[cpu].run_queue.pop_front();
        QUEUED[cpu].store(self.cpus[cpu].run_queue.len(), Ordering::Release);
        next
    }
}

/// Records the job's main thread (tid = pid), running on CPU 0 on the boot trap stack in
/// address space `aspace` (loaded), and lets the other CPUs join.
pub fn init_main_thread(aspace: (u64, u64)) {
    let main = Thread {
        pid: job::PID,
        aspace,
        doomed: false,
        signal_interrupt: false,
        exiting: false,
        cpu: 0,
        slot: 0,
        stack_top: tables::trap_stack_top(),
        stack_physical: None,
        state: State::Runnable,
        wait_result: WaitResult::Woken,
        fs_base: 0,
        gs_base: 0,
        clear_child_tid: 0,
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
    threads.insert(job::PID, main);
    let mut cpus: Vec<Cpu> = (0..MAX_CPUS).map(|_| Cpu::default()).collect();
    cpus[0].current = Some(job::PID);
    *SCHEDULER.lock() = Some(Scheduler { threads, cpus, next_tid: job::PID + 1, free_slots: (1..MAX_THREADS).rev().collect() });
    ONLINE_CPUS.store(1, Ordering::Release);
    for queued in &QUEUED {
        queued.store(0, Ordering::Release);
    }
    CURRENT_PID[0].store(job::PID, Ordering::Relaxed);
    LOADED_ASPACE[0].store(aspace.0, Ordering::Release);
    fpu::start_first_thread(0, 0);
    DOOMED_THREADS.store(0, Ordering::Release);
    JOB_END_REQUEST.store(NO_END_REQUEST, Ordering::Release);
    CPUS_RELEASED.store(true, Ordering::Release);
    bring_back_parked_cpus();
}

/// CPU 0's idle stack (physical), allocated with the first job.
static CPU0_IDLE_STACK: AtomicU64 = AtomicU64::new(0);

/// A persistent enclave's job ended (it exited, or the host killed it) on a CPU other than
/// 0: the status for CPU 0 to report, since the service loop runs there (the channel
/// interrupt arrives there). `NO_END_REQUEST` otherwise.
static JOB_END_REQUEST: AtomicU32 = AtomicU32::new(NO_END_REQUEST);
const NO_END_REQUEST: u32 = u32::MAX;

/// Called on a CPU other than 0 when the job ends there: asks CPU 0 to end it (the first
/// request wins, as the first `exit_group` does on Linux) and parks this CPU. CPU 0 notices
/// at its next tick, idle round or wake-up (`end_job_if_requested`).
pub fn hand_job_end_to_cpu0(status: u8) -> ! {
    let cpu = tables::current_cpu();
    let _ = JOB_END_REQUEST.compare_exchange(NO_END_REQUEST, status as u32, Ordering::AcqRel, Ordering::Acquire);
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
            job::exit(status as u8);
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

/// Persistent enclaves, between jobs: the CPUs other than the one ending a job drop its
/// threads and park (`park_other_cpus`), each on a stack of its own with the kernel's page
/// tables, until the next job's scheduler exists and brings them back.
static PARK_REQUESTED: AtomicBool = AtomicBool::new(false);
/// Bit n set while CPU n is parked.
static PARKED: AtomicU64 = AtomicU64::new(0);
/// Bumped when a new job's scheduler is ready: parked CPUs then rejoin.
static JOB_GENERATION: AtomicU64 = AtomicU64::new(0);
static PARK_STACKS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// How long the CPU ending a job waits for the others to park, and a new job for them to
/// come back (emulated kernel code on PVM: a few ms each).
const PARK_TIMEOUT_NS: u64 = 2_000_000_000;

/// Asks every other online CPU to drop the job's threads and park (a tick IPI reaches a
/// thread in user mode and wakes an idle CPU). Returns false if one cannot be reached (no
/// x2APIC id) or has not parked in time: it may still run the job's code.
pub fn park_other_cpus() -> bool {
    let cpu = tables::current_cpu();
    // A job never ends inside the scheduler's lock, so waiting for it here is safe.
    let others = online_cpu_mask() & !(1 << cpu);
    if cpus_in(others).any(|index| apic_id(index).is_none()) {
        return false;
    }
    PARK_REQUESTED.store(true, Ordering::Release);
    for index in cpus_in(others) {
        apic::send_tick(apic_id(index).expect("checked above"));
    }
    let deadline = clock::monotonic_ns() + PARK_TIMEOUT_NS;
    while PARKED.load(Ordering::Acquire) & others != others {
        if clock::monotonic_ns() > deadline {
            return false;
        }
        core::hint::spin_loop();
    }
    PARK_REQUESTED.store(false, Ordering::Release);
    true
}

/// Called where another CPU may be asked to park: a tick that interrupted a job thread, each
/// round of the idle loop, and each round of a wait for the host's answer. None holds a lock.
pub fn park_if_requested(cpu: usize) {
    if cpu != 0 && PARK_REQUESTED.load(Ordering::Acquire) {
        park(cpu)
    }
}

fn park(cpu: usize) -> ! {
    use_kernel_tables(cpu);
    apic::disarm_timer();
    let mut stack = PARK_STACKS[cpu].load(Ordering::Relaxed);
    if stack == 0 {
        let physical = pmem::allocate(KERNEL_STACK_SIZE, PAGE_SIZE).expect("no memory for a parking stack");
        stack = phys::to_virtual(physical) + KERNEL_STACK_SIZE;
        PARK_STACKS[cpu].store(stack, Ordering::Relaxed);
    }
    PARKED_GENERATION[cpu].store(JOB_GENERATION.load(Ordering::Acquire), Ordering::Relaxed);
    PARKED.fetch_or(1 << cpu, Ordering::AcqRel);
    // The thread's kernel stack (and the idle loop's) are left behind for good.
    crate::arch::channel::run_on_stack(stack, parked_loop)
}

static PARKED_GENERATION: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// A parked CPU: halts until the next job's scheduler exists, then joins it.
extern "C" fn parked_loop() -> ! {
    let cpu = tables::current_cpu();
    while JOB_GENERATION.load(Ordering::Acquire) == PARKED_GENERATION[cpu].load(Ordering::Relaxed) {
        if apic_id(cpu).is_some() {
            apic::sleep_until_interrupt();
        } else {
            core::hint::spin_loop();
        }
    }
    PARKED.fetch_and(!(1 << cpu), Ordering::AcqRel);
    join_cpu(cpu)
}

/// A new job's scheduler exists: parked CPUs rejoin, and the job starts once they are online
/// (its first threads are placed over them).
fn bring_back_parked_cpus() {
    let parked = PARKED.load(Ordering::Acquire);
    JOB_GENERATION.fetch_add(1, Ordering::AcqRel);
    if parked == 0 {
        return;
    }
    for cpu in cpus_in(parked) {
        if let Some(apic_id) = apic_id(cpu) {
            apic::send_wake(apic_id);
        }
    }
    let deadline = clock::monotonic_ns() + PARK_TIMEOUT_NS;
    while online_cpu_mask() & parked != parked && clock::monotonic_ns() < deadline {
        core::hint::spin_loop();
    }
}

/// Called by each other CPU once its own tables are loaded: waits for the job, joins the
/// scheduler and runs its idle loop.
pub fn join_cpu(cpu: usize) -> ! {
    while !CPUS_RELEASED.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    // Each thread brings its address space (`enter_thread`); until then the kernel's tables.
    LOADED_ASPACE[cpu].store(0, Ordering::Release);
    ONLINE_CPUS.fetch_or(1 << cpu, Ordering::AcqRel);
    idle_loop(cpu)
}

#[derive(Debug)]
pub enum AffinityError {
    NoSuchThread,
    NoOnlineCpu,
}

/// Moves thread `tid` to the lowest online CPU in `mask` unless its CPU is in the mask. A
/// thread moved off the calling CPU while running leaves it at once and continues there.
pub fn set_affinity(tid: u64, mask: u64) -> Result<(), AffinityError> {
    let cpu = tables::current_cpu();
    let moving_self = with_scheduler(|scheduler| {
        let allowed = mask & online_cpu_mask();
        let target = (allowed != 0).then(|| allowed.trailing_zeros() as usize).ok_or(AffinityError::NoOnlineCpu)?;
        let thread = scheduler.threads.get_mut(&tid).ok_or(AffinityError::NoSuchThread)?;
        if allowed & (1 << thread.cpu) != 0 {
            return Ok(false);
        }
        let home = thread.cpu;
        thread.cpu = target;
        if scheduler.cpus[home].current == Some(tid) {
            return Ok(true);
        }
        // Queued or waiting elsewhere: it runs on the new CPU from its next wake-up.
        if let Some(position) = scheduler.cpus[home].run_queue.iter().position(|&queued| queued == tid) {
            scheduler.cpus[home].run_queue.remove(position);
            QUEUED[home].store(scheduler.cpus[home].run_queue.len(), Ordering::Release);
            scheduler.enqueue(tid);
        }
        Ok(false)
    })?;
    if moving_self {
        // Queue ourselves on the new CPU and give this one up; we resume over there.
        leave_cpu(
            |scheduler| {
                let current = scheduler.current(cpu);
                scheduler.enqueue(current);
                scheduler.threads[&current].slot
            },
            cpu,
        );
    }
    Ok(())
}

pub fn thread_count() -> usize {
    with_scheduler(|scheduler| scheduler.threads.len())
}

/// TLB shootdown. Unmapping job memory flushes only the CPU that unmapped it; when other
/// CPUs may still cache the translations (an XPMEM attachment revoked because the host takes
/// its memory away), the unmapping CPU bumps the generation and sends them a tick IPI. Each
/// CPU drops its user translations when it sees a newer generation: in the IPI's handler, and
/// whenever it enters a thread (a CPU without an x2APIC id cannot be sent the IPI, and one
/// that was idle may have kept a thread's translations).
static TLB_GENERATION: AtomicU64 = AtomicU64::new(0);
/// The generation each CPU flushed last.
static TLB_FLUSHED: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// How long the unmapping CPU waits for the others: a CPU in user mode takes the IPI at
/// once; one in the kernel (interrupts off) takes it before it returns to user mode, so
/// the wait only bounds how long the caller holds back its acknowledgement.
const SHOOTDOWN_TIMEOUT_NS: u64 = 50_000_000;

/// Makes every other CPU of the job drop its user translations; returns once each online CPU
/// that can be sent an IPI has flushed (or the timeout passed).
pub fn shoot_down_user_tlbs() {
    let (generation, others) = start_shootdown();
    // A one-CPU enclave is done here: each step below is emulated work on PVM, paid per detach.
    if others == 0 {
        return;
    }
    let deadline = clock::monotonic_ns() + SHOOTDOWN_TIMEOUT_NS;
    while cpus_in(others).any(|index| TLB_FLUSHED[index].load(Ordering::Acquire) < generation) {
        if clock::monotonic_ns() > deadline {
            log!("xpmem: a CPU did not confirm the TLB shootdown in time; it flushes before it next runs user code");
            return;
        }
        core::hint::spin_loop();
    }
}

/// A TLB shootdown that does not wait: other CPUs of the job drop their user translations
/// when the tick IPI reaches them, or before they next run user code.
pub fn start_user_tlb_shootdown() {
    start_shootdown();
}

/// Flushes here, sends the other CPUs the tick; returns the new generation and those CPUs.
fn start_shootdown() -> (u64, u64) {
    let cpu = tables::current_cpu();
    let generation = TLB_GENERATION.fetch_add(1, Ordering::AcqRel) + 1;
    flush_here(cpu, generation);
    let others = cpus_in(online_cpu_mask() & !(1 << cpu)).filter(|&index| apic_id(index).is_some()).fold(0u64, |bits, index| bits | 1 << index);
    for index in cpus_in(others) {
        apic::send_tick(apic_id(index).expect("filtered above"));
    }
    (generation, others)
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

/// Flushes this CPU's user translations if another CPU asked since it last did.
pub fn flush_tlb_if_stale() {
    let cpu = tables::current_cpu();
    let generation = TLB_GENERATION.load(Ordering::Acquire);
    if TLB_FLUSHED[cpu].load(Ordering::Relaxed) < generation {
        flush_here(cpu, generation);
    }
}

fn flush_here(cpu: usize, generation: u64) {
    crate::arch::paging::flush_user_tlb();
    TLB_FLUSHED[cpu].fetch_max(generation, Ordering::AcqRel);
}

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

/// How long CPU 0 waits for the others before starting a job without them.
const CPU_START_TIMEOUT_NS: u64 = 2_000_000_000;

/// The job starts with every CPU it will get (threads are placed on online CPUs): waits until
/// `expected` CPUs are online, or 2 s.
pub fn wait_for_cpus(expected: u32) {
    let deadline = clock::monotonic_ns() + CPU_START_TIMEOUT_NS;
    while online_cpu_mask().count_ones() < expected && clock::monotonic_ns() < deadline {
        core::hint::spin_loop();
    }
    let online = online_cpu_mask().count_ones();
    if online < expected {
        log!("only {online} of {expected} CPUs started");
    }
}

/// Bit n set for each online CPU n.
pub fn online_cpu_mask() -> u64 {
    ONLINE_CPUS.load(Ordering::Acquire)
}

/// Bit n set while CPU n runs the job's threads: CPU 0 from the scheduler's creation, the
/// others as they join; cleared with the scheduler. An atomic, not a field under the
/// scheduler's lock, so the per-detach TLB shootdown reads it in one instruction.
static ONLINE_CPUS: AtomicU64 = AtomicU64::new(0);

extern "C" fn idle_entry() -> ! {
    idle_loop(tables::current_cpu())
}

/// How many idle polls pass between checks for expired timed waits and dead-lock, on a
/// CPU that cannot sleep.
const IDLE_CHECK_INTERVAL: u32 = 1024;

enum IdleStep {
    Run(usize, u64, u64, Option<(u64, u64)>),
    /// Nothing to do until another CPU queues a thread here and sends the wake-up IPI.
    Sleep,
    /// A timed wait may expire (or the CPU has no x2APIC): look again soon.
    Poll,
}

/// A CPU with no thread to run: sleeps in HLT when only a wake-up IPI can give it work, else
/// polls its queue and the clock.
fn idle_loop(cpu: usize) -> ! {
    loop {
        park_if_requested(cpu);
        end_job_if_requested(cpu);
        let step = with_scheduler(|scheduler| {
            expire_timed_waits(scheduler, cpu);
            if let Some(next) = scheduler.dequeue(cpu) {
                let (slot, stack_top, pid, load) = enter_thread(scheduler, cpu, next);
                return IdleStep::Run(slot, stack_top, pid, load);
            }
            let timed_wait_here = scheduler
                .threads
                .values()
                .any(|thread| thread.cpu == cpu && matches!(thread.state, State::Waiting { deadline: Some(_), .. }));
            if timed_wait_here || apic_id(cpu).is_none() {
                IdleStep::Poll
            } else {
                IdleStep::Sleep
            }
        });
        match step {
            IdleStep::Run(slot, stack_top, pid, load) => {
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
/// thread gets a time slice, enforced by the timer only if others wait for this CPU
/// (tickless otherwise).
fn enter_thread(scheduler: &mut Scheduler, cpu: usize, next: u64) -> (usize, u64, u64, Option<(u64, u64)>) {
    flush_tlb_if_stale();
    scheduler.cpus[cpu].current = Some(next);
    let quantum_end = cpu::read_tsc() + clock::tsc_hz() * QUANTUM_MS / 1000;
    QUANTUM_END[cpu].store(quantum_end, Ordering::Relaxed);
    let thread = &scheduler.threads[&next];
    if thread.doomed {
        // It ends at its next entry to the kernel: make that now (a thread that never ran
        // starts straight in user mode).
        apic::arm_timer(cpu::read_tsc());
    } else if scheduler.cpus[cpu].run_queue.is_empty() {
        apic::disarm_timer();
    } else {
        apic::arm_timer(quantum_end);
    }
    cpu::write_msr(MSR_FS_BASE, thread.fs_base);
    cpu::write_msr(MSR_GS_BASE, thread.gs_base);
    let load = (LOADED_ASPACE[cpu].load(Ordering::Relaxed) != thread.aspace.0).then_some(thread.aspace);
    (thread.slot, thread.stack_top, thread.pid, load)
}

/// `cpu` now runs process `pid`, in `load` if it must load that address space.
fn settle_process(cpu: usize, pid: u64, load: Option<(u64, u64)>) {
    CURRENT_PID[cpu].store(pid, Ordering::Relaxed);
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
        .filter(|(_, thread)| thread.cpu == cpu && matches!(thread.state, State::Waiting { deadline: Some(deadline), .. } if deadline <= now))
        .map(|(&tid, _)| tid)
        .collect();
    for tid in expired {
        let thread = scheduler.threads.get_mut(&tid).expect("waiting thread");
        thread.state = State::Runnable;
        thread.wait_result = WaitResult::TimedOut;
        scheduler.enqueue(tid);
    }
}

/// Leaves `cpu` to its next runnable thread, or to its idle loop, after `prepare` has said
/// why (changing the current thread's state, under the lock) and returned the current
/// thread's context slot. Returns when the current thread runs again.
fn leave_cpu(prepare: impl FnOnce(&mut Scheduler) -> usize, cpu: usize) {
    let (from, to, stack_top, next_process) = with_scheduler(|scheduler| {
        let from = prepare(scheduler);
        trap::mark_leaving(from);
        match scheduler.dequeue(cpu) {
            Some(next) => {
                let (to, stack_top, pid, load) = enter_thread(scheduler, cpu, next);
                (from, to, stack_top, Some((pid, load)))
            }
            None => {
                scheduler.cpus[cpu].current = None;
                (from, trap::idle_slot(cpu), 0, None)
            }
        }
    });
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
    free_exited_stacks(cpu);
}

fn free_exited_stacks(cpu: usize) {
    let stacks = with_scheduler(|scheduler| core::mem::take(&mut scheduler.cpus[cpu].exited_stacks));
    for stack in stacks {
        pmem::free(stack, KERNEL_STACK_SIZE);
    }
}

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

/// A thread id no thread has yet: a process forked with it as its pid gets it as its first
/// thread's id (`spawn_process`).
pub fn reserve_tid() -> u64 {
    with_scheduler(|scheduler| {
        scheduler.next_tid += 1;
        scheduler.next_tid - 1
    })
}

/// The first thread of the new process `pid` (a `reserve_tid`), forked by the caller, whose
/// address space is `aspace`.
pub fn spawn_process(pid: u64, frame: &TrapFrame, fs_base: u64, clear_child_tid: u64, aspace: (u64, u64)) -> Result<u64, SpawnError> {
    spawn_in(frame, fs_base, clear_child_tid, Some((pid, aspace)))
}

fn spawn_in(frame: &TrapFrame, fs_base: u64, clear_child_tid: u64, new_process: Option<(u64, (u64, u64))>) -> Result<u64, SpawnError> {
    let stack_physical = pmem::allocate(KERNEL_STACK_SIZE, PAGE_SIZE).ok_or(SpawnError::NoMemory)?;
    let stack_top = phys::to_virtual(stack_physical) + KERNEL_STACK_SIZE;
    let caller_cpu = tables::current_cpu();
    // The new thread starts with its creator's vector registers, as on Linux.
    let creator_state = fpu::save_running(caller_cpu);
    let result = with_scheduler(|scheduler| {
        let slot = scheduler.free_slots.pop().ok_or(SpawnError::TooManyThreads)?;
        let tid = match new_process {
            Some((pid, _)) => pid,
            None => {
                scheduler.next_tid += 1;
                scheduler.next_tid - 1
            }
        };
        let mut load = [0usize; MAX_CPUS];
        for thread in scheduler.threads.values() {
            load[thread.cpu] += 1;
        }
        let cpu = cpus_in(online_cpu_mask()).min_by_key(|&cpu| (load[cpu], cpu)).unwrap_or(0);
        let caller = scheduler.current_thread(caller_cpu);
        let (pid, aspace) = new_process.unwrap_or((caller.pid, caller.aspace));
        let gs_base = caller.gs_base;
        trap::prepare_thread(slot, stack_top, frame);
        fpu::inherit(slot, creator_state);
        let thread = Thread {
            pid,
            aspace,
            doomed: false,
        signal_interrupt: false,
            exiting: false,
            cpu,
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
        let victims: Vec<u64> = scheduler.threads.iter().filter(|&(&tid, thread)| thread.pid == pid && Some(tid) != spare).map(|(&tid, _)| tid).collect();
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

/// How long a thread runs before another thread waiting for its CPU gets it.
const QUANTUM_MS: u64 = 10;
/// When the running thread's time slice ends, per CPU (TSC).
static QUANTUM_END: [core::sync::atomic::AtomicU64; MAX_CPUS] = [const { core::sync::atomic::AtomicU64::new(0) }; MAX_CPUS];

/// The tick interrupted a thread in user mode: if its time slice is over and another thread
/// waits for this CPU, it goes to the back of the queue; else the timer is set for the end
/// of the slice (or stopped when nobody waits).
pub fn tick() {
    let cpu = tables::current_cpu();
    park_if_requested(cpu);
    end_job_if_requested(cpu);
    if QUEUED[cpu].load(Ordering::Acquire) == 0 {
        apic::disarm_timer();
        return;
    }
    let quantum_end = QUANTUM_END[cpu].load(Ordering::Relaxed);
    if cpu::read_tsc() >= quantum_end {
        yield_now();
    } else {
        apic::arm_timer(quantum_end);
    }
}

/// sched_yield: the next runnable thread of this CPU runs; the current one goes to the back
/// of the queue.
pub fn yield_now() {
    let cpu = tables::current_cpu();
    if QUEUED[cpu].load(Ordering::Acquire) == 0 {
        return;
    }
    leave_cpu(
        |scheduler| {
            let current = scheduler.current(cpu);
            scheduler.enqueue(current);
            scheduler.threads[&current].slot
        },
        cpu,
    );
}

/// Blocks the current thread on the futex word at `address` (of its process's memory, or a
/// kernel address: `wake_kernel_key`) if `still_expected()` holds (checked with the
/// scheduler locked, so no wake is lost in between). Returns `None` if it did not hold;
/// `Interrupted` at once if the thread's process is being killed, `Signal` if a signal the
/// thread takes arrived since it last passed delivery (checked after `still_expected`, as
/// Linux's futex wait checks the word first).
pub fn wait(address: u64, bitset: u32, deadline: Option<u64>, still_expected: impl FnOnce() -> bool) -> Option<WaitResult> {
    let cpu = tables::current_cpu();
    let mut outcome = None;
    let mut dead_lock = false;
    leave_cpu(
        |scheduler| {
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
                    .all(|(&tid, thread)| tid == current || matches!(thread.state, State::Waiting { deadline: None, .. }));
                dead_lock = deadline.is_none() && others_all_wait;
                if !dead_lock {
                    let thread = scheduler.current_thread(cpu);
                    thread.state = State::Waiting { address, bitset, deadline };
                    thread.wait_result = WaitResult::Woken;
                    outcome = Some(WaitResult::Woken);
                    return thread.slot;
                }
            }
            // Not blocking after all: stay, by running ourselves next.
            scheduler.cpus[cpu].run_queue.push_front(current);
            scheduler.threads[&current].slot
        },
        cpu,
    );
    if dead_lock {
        // Ended outside the scheduler's lock, so that a persistent enclave can reuse it.
        log!("every thread of the job waits on a futex that nobody can wake: dead-lock");
        job::exit(128 + 9);
    }
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
    with_scheduler(|scheduler| wake_locked(scheduler, Some(pid), address, count, bitset))
}

/// Wakes every thread waiting on the kernel's key `key` (a kernel address naming what they
/// wait for: a pipe, a process's children), whatever their process; and every thread in
/// `poll` (`wait_for_any_key`), which looks again at what it watches.
pub fn wake_kernel_key(key: u64) {
    with_scheduler(|scheduler| {
        wake_locked(scheduler, None, key, u64::MAX, u32::MAX);
        if POLLERS.load(Ordering::Relaxed) != 0 {
            wake_locked(scheduler, None, poll_key(), u64::MAX, u32::MAX);
        }
    });
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
pub fn wait_for_any_key(deadline: Option<u64>, still_expected: impl FnOnce() -> bool) -> Option<WaitResult> {
    POLLERS.fetch_add(1, Ordering::Relaxed);
    let result = wait(poll_key(), u32::MAX, deadline, still_expected);
    POLLERS.fetch_sub(1, Ordering::Relaxed);
    result
}

fn wake_locked(scheduler: &mut Scheduler, pid: Option<u64>, address: u64, count: u64, bitset: u32) -> u64 {
    let waiting: Vec<u64> = scheduler
        .threads
        .iter()
        .filter(|(_, thread)| pid.is_none_or(|pid| thread.pid == pid))
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
        let woken = wake_locked(scheduler, Some(pid), from, wake_count, u32::MAX);
        let mut moved = 0;
        for thread in scheduler.threads.values_mut().filter(|thread| thread.pid == pid) {
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

/// Ends the current thread. The last thread of its process ends the process (`status` is its
/// exit code unless it was killed or called `exit_group`); the job's first process ending
/// ends the job.
pub fn exit_current(status: u8) -> ! {
    let cpu = tables::current_cpu();
    let (clear_child_tid, pid, slot, last) = with_scheduler(|scheduler| {
        let current = scheduler.current(cpu);
        let thread = scheduler.threads.get_mut(&current).expect("current thread");
        thread.exiting = true;
        if thread.doomed {
            thread.doomed = false;
            DOOMED_THREADS.fetch_sub(1, Ordering::AcqRel);
        }
        let (clear_child_tid, pid, slot) = (thread.clear_child_tid, thread.pid, thread.slot);
        let last = !scheduler.threads.values().any(|other| other.pid == pid && !other.exiting);
        (clear_child_tid, pid, slot, last)
    });
    // Its vector state area leaves its process, which may live on: the slot's next thread
    // may belong to another process (which saves into it only once it has run, long after
    // the other CPUs have taken the shootdown's IPI).
    if let Some(area) = fpu::thread_ended(cpu, slot) {
        if !last {
            let _ = job::with_process(|process| process.memory.aspace.unmap(area, PAGE_SIZE));
            start_user_tlb_shootdown();
        }
    }
    if clear_child_tid != 0 && !last {
        // pthread_join waits for this word to become zero.
        let _ = trap::copy_to_user(clear_child_tid, &0u32.to_le_bytes());
        wake(clear_child_tid, 1, u32::MAX);
    }
    crate::signal::thread_exited(with_scheduler(|scheduler| scheduler.current(cpu)));
    if last {
        // The job ends (its first process), or the process's memory goes now: off its tables.
        crate::process::last_thread_exited(pid, status);
    } else {
        // This CPU may idle with the process's tables loaded; the process may end meanwhile.
        use_kernel_tables(cpu);
    }
    leave_cpu(
        |scheduler| {
            let current = scheduler.current(cpu);
            let thread = scheduler.threads.remove(&current).expect("current thread");
            scheduler.free_slots.push(thread.slot);
            scheduler.cpus[cpu].exited_stacks.extend(thread.stack_physical);
            trap::exit_slot(cpu)
        },
        cpu,
    );
    unreachable!("an exited thread was resumed")
}
