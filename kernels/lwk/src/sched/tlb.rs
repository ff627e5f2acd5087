//! TLB shootdown across the CPUs of the job.

use super::{apic_id, cpus_in, online_cpu_mask};
use crate::arch::apic;
use crate::arch::tables::{self, MAX_CPUS};
use crate::clock;
use crate::console::log;
use core::sync::atomic::{AtomicU64, Ordering};

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
    let others =
        cpus_in(online_cpu_mask() & !(1 << cpu)).filter(|&index| apic_id(index).is_some()).fold(0u64, |bits, index| bits | 1 << index);
    for index in cpus_in(others) {
        apic::send_tick(apic_id(index).expect("filtered above"));
    }
    (generation, others)
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
