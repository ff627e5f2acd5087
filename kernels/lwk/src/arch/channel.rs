//! The machine side of the enclave channel (`crates/channel`): the shared region reached
//! through the physical-memory window, the interrupt the host raises when it has written to
//! an idle kernel, the doorbell port, and the stack switch that takes the kernel back to its
//! service loop when a job ends.

use super::cpu;
use super::phys;
use clowder_channel::{AttachError, Channel};
use core::arch::asm;

/// Validates the channel region the VMM formatted at guest-physical `physical`.
pub fn attach(physical: u64, size: usize) -> Result<Channel, AttachError> {
    // SAFETY: the region is reserved RAM (the memory map says so, so no allocator hands it
    // out) inside the physical-memory window, and lives as long as the machine; the channel
    // crate only touches it with atomic and volatile accesses, as the host does.
    unsafe { Channel::attach(phys::to_virtual(physical) as *mut u8, size) }
}

pub fn ring_doorbell(port: u16) {
    cpu::outl(port, 1);
}

// The host wrote to the channel while the kernel was not polling it.
guest_arch::interrupt_stub!(channel_interrupt, lwk_channel_interrupt);

extern "C" {
    static channel_interrupt: u8;
}

/// x2APIC EOI register. The channel exists only under clowder-vmm on KVM, whose LAPIC always
/// offers x2APIC mode, which `apic::init_local_apic` then uses.
const X2APIC_EOI_MSR: u32 = 0x80b;

#[no_mangle]
extern "C" fn lwk_channel_interrupt() {
    cpu::write_msr(X2APIC_EOI_MSR, 0);
    crate::enclave::on_channel_interrupt();
}

/// Points IDT entry `vector` at the channel's interrupt handler (an interrupt gate: the
/// handler runs with interrupts off, on the current stack in ring 0, or on TSS.RSP0 when it
/// interrupts the job).
pub fn install_interrupt_handler(vector: u8) {
    #[repr(C, packed)]
    struct TableRegister {
        limit: u16,
        base: u64,
    }
    let mut idt = TableRegister { limit: 0, base: 0 };
    let code_selector: u16;
    // SAFETY: SIDT stores the IDT register; reading CS has no effect.
    unsafe {
        asm!("sidt [{}]", in(reg) &raw mut idt, options(nostack, preserves_flags));
        asm!("mov {0:x}, cs", out(reg) code_selector, options(nomem, nostack, preserves_flags));
    }
    let handler = &raw const channel_interrupt as u64;
    let low = (handler & 0xffff) | (code_selector as u64) << 16 | 0x8e00u64 << 32 | ((handler >> 16) & 0xffff) << 48;
    let high = handler >> 32;
    let entry = idt.base + vector as u64 * 16;
    assert!(vector as u64 * 16 + 15 <= idt.limit as u64, "IDT too short for the channel vector");
    // SAFETY: the IDT is the kernel's, shared by every CPU and written only at boot; the entry
    // for this vector is unused (the vectors the kernel uses are the exceptions and 0xf0..).
    unsafe {
        core::ptr::write_volatile(entry as *mut u64, low);
        core::ptr::write_volatile((entry + 8) as *mut u64, high);
    }
}

/// Leaves the current stack for good: runs `entry` on the stack ending at `stack_top`.
pub fn run_on_stack(stack_top: u64, entry: extern "C" fn() -> !) -> ! {
    // SAFETY: the stack is kernel memory reserved for this purpose, 16-byte aligned at its
    // top; nothing on the abandoned stack is used again.
    unsafe {
        asm!("mov rsp, {top}", "xor ebp, ebp", "call {entry}", "ud2",
             top = in(reg) stack_top, entry = in(reg) entry, options(noreturn))
    }
}
