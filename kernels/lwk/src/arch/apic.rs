//! The local APIC in x2APIC mode (MSR access, no MMIO mapping): only what idle CPUs need,
//! sleeping in HLT until another CPU queues a thread for them and sends a wake-up IPI.

use super::cpu;
use core::arch::{asm, global_asm};

pub const WAKE_VECTOR: usize = 0xf0;
pub const SPURIOUS_VECTOR: usize = 0xff;

const MSR_APIC_BASE: u32 = 0x1b;
const MSR_X2APIC_ID: u32 = 0x802;
const MSR_X2APIC_TPR: u32 = 0x808;
const MSR_X2APIC_SPURIOUS: u32 = 0x80f;
const MSR_X2APIC_ICR: u32 = 0x830;

global_asm!(
    r#"
    .text
    .global wake_interrupt, spurious_interrupt
    /* The wake-up IPI only ends a HLT: acknowledge it and return. */
wake_interrupt:
    push %rax
    push %rcx
    push %rdx
    mov $0x80b, %ecx                   /* x2APIC EOI */
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
    pop %rdx
    pop %rcx
    pop %rax
    iretq
spurious_interrupt:
    iretq
"#,
    options(att_syntax)
);

extern "C" {
    static wake_interrupt: u8;
    static spurious_interrupt: u8;
}

pub fn wake_handler() -> u64 {
    &raw const wake_interrupt as u64
}

pub fn spurious_handler() -> u64 {
    &raw const spurious_interrupt as u64
}

/// Enables this CPU's local APIC in x2APIC mode; returns its APIC id, or `None` without
/// x2APIC (then idle CPUs poll instead of sleeping).
pub fn init_local_apic() -> Option<u32> {
    if cpu::cpuid(1, 0).ecx & (1 << 21) == 0 {
        return None;
    }
    cpu::write_msr(MSR_APIC_BASE, cpu::read_msr(MSR_APIC_BASE) | 1 << 11 | 1 << 10); // enable, x2APIC
    cpu::write_msr(MSR_X2APIC_SPURIOUS, 0x100 | SPURIOUS_VECTOR as u64); // software enable
    cpu::write_msr(MSR_X2APIC_TPR, 0);
    Some(cpu::read_msr(MSR_X2APIC_ID) as u32)
}

/// Sends the wake-up IPI to the CPU with local APIC id `apic_id`.
pub fn send_wake(apic_id: u32) {
    cpu::write_msr(MSR_X2APIC_ICR, (apic_id as u64) << 32 | WAKE_VECTOR as u64);
}

/// Starts every other CPU at the real-mode page `start_page` (INIT, then two STARTUPs, as
/// the MP specification asks), with `wait_us` sleeping between the steps.
pub fn start_other_cpus(start_page: u64, wait_us: impl Fn(u64)) {
    const ALL_BUT_SELF: u64 = 0b11 << 18;
    const ASSERT: u64 = 1 << 14;
    cpu::write_msr(MSR_X2APIC_ICR, ALL_BUT_SELF | ASSERT | 0x500); // INIT
    wait_us(10_000);
    for _ in 0..2 {
        cpu::write_msr(MSR_X2APIC_ICR, ALL_BUT_SELF | ASSERT | 0x600 | start_page); // STARTUP
        wait_us(200);
    }
}

/// Sleeps until an interrupt arrives. Interrupts are off in the kernel, and STI takes effect
/// only after the next instruction, so a wake-up sent after the caller last looked at its
/// queue is still pending at the HLT and ends it at once.
pub fn sleep_until_interrupt() {
    // SAFETY: interrupts are enabled only across HLT; the only sources are the wake-up and
    // spurious vectors, whose handlers preserve every register.
    unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) }
}
