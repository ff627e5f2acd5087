//! CPU bring-up and parking: the other CPUs join the job's scheduler, park between the jobs
//! of a persistent enclave and rejoin the next one.

use super::run::idle_loop;
use super::{apic_id, cpus_in, online_cpu_mask, use_kernel_tables, LOADED_ASPACE, ONLINE_CPUS};
use crate::arch::apic;
use crate::arch::paging::PAGE_SIZE;
use crate::arch::phys;
use crate::arch::tables::{self, MAX_CPUS};
use crate::arch::trap::KERNEL_STACK_SIZE;
use crate::clock;
use crate::console::log;
use crate::mm::pmem;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set once the main thread exists: the other CPUs may join.
pub(super) static CPUS_RELEASED: AtomicBool = AtomicBool::new(false);
/// Set once CPU 0 has filled the shared IDT: the other CPUs may load their tables.
static CPU_TABLES_READY: AtomicBool = AtomicBool::new(false);

pub fn mark_cpu_tables_ready() {
    CPU_TABLES_READY.store(true, Ordering::Release);
}

pub fn cpu_tables_ready() -> bool {
    CPU_TABLES_READY.load(Ordering::Acquire)
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

pub(super) fn park(cpu: usize) -> ! {
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
pub(super) fn bring_back_parked_cpus() {
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
