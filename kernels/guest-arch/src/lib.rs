//! x86-64 primitives shared by the guest kernels (`lwk`, `testguest`): single privileged
//! instructions wrapped as safe functions. Each runs in ring 0 only (ring 3 takes #GP), except
//! port I/O a VMM lets through (the channel doorbell).

#![no_std]

use core::arch::asm;

pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects visible to Rust; the ports are the VMM's devices.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags)) }
}

pub fn outw(port: u16, value: u16) {
    // SAFETY: as `outb`.
    unsafe { asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack, preserves_flags)) }
}

/// Always inlined: ring-3 code rings the channel doorbell with it and must not call kernel text.
#[inline(always)]
pub fn outl(port: u16, value: u32) {
    // SAFETY: as `outb`.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags)) }
}

/// The first serial port (a virtual 16550 under QEMU and clowder-vmm).
pub const COM1: u16 = 0x3f8;

/// Writes `bytes` to COM1 without polling the line status: a virtual 16550's transmitter
/// never fills, and each port access is a VM exit (~9 us on PVM), so polling would double
/// them.
pub fn com1_write(bytes: &[u8]) {
    for &byte in bytes {
        outb(COM1, byte);
    }
}

pub fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: as `outb`.
    unsafe { asm!("in al, dx", in("dx") port, out("al") value, options(nomem, nostack, preserves_flags)) }
    value
}

pub fn inw(port: u16) -> u16 {
    let value: u16;
    // SAFETY: as `outb`.
    unsafe { asm!("in ax, dx", in("dx") port, out("ax") value, options(nomem, nostack, preserves_flags)) }
    value
}

pub fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: as `outb`.
    unsafe { asm!("in eax, dx", in("dx") port, out("eax") value, options(nomem, nostack, preserves_flags)) }
    value
}

pub fn read_msr(msr: u32) -> u64 {
    let (low, high): (u32, u32);
    // SAFETY: reading an MSR the caller chose; a missing one raises #GP, which the kernels'
    // IDTs report.
    unsafe { asm!("rdmsr", in("ecx") msr, out("eax") low, out("edx") high, options(nomem, nostack, preserves_flags)) }
    (u64::from(high) << 32) | u64::from(low)
}

pub fn write_msr(msr: u32, value: u64) {
    // SAFETY: as `read_msr`; the values written are checked by the callers' invariants.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") value as u32, in("edx") (value >> 32) as u32,
             options(nostack, preserves_flags))
    }
}

/// Defines the interrupt entry stub `$stub` (a global symbol for the IDT) that calls
/// `$handler`, an ordinary `extern "C" fn()` with an unmangled name, and returns with `iretq`.
/// Only the registers a C call may clobber are saved. The CPU leaves RSP 8 bytes off a
/// 16-byte boundary after its 5-word frame; the nine pushes realign it for the call.
#[macro_export]
macro_rules! interrupt_stub {
    ($stub:ident, $handler:ident) => {
        core::arch::global_asm!(
            concat!(
                ".text\n.global ",
                stringify!($stub),
                "\n",
                stringify!($stub),
                ":\n",
                "push %rax\npush %rcx\npush %rdx\npush %rsi\npush %rdi\npush %r8\npush %r9\npush %r10\npush %r11\n",
                "cld\ncall ",
                stringify!($handler),
                "\n",
                "pop %r11\npop %r10\npop %r9\npop %r8\npop %rdi\npop %rsi\npop %rdx\npop %rcx\npop %rax\n",
                "iretq\n"
            ),
            options(att_syntax)
        );
    };
}

/// The 64-bit task-state segment (Intel SDM vol. 3, "Task Management in 64-bit Mode"): the
/// stack the CPU switches to on a trap from ring 3 (`rsp[0]`) and the interrupt stacks
/// (`ist`). No I/O bitmap: ring-3 port I/O is decided by IOPL alone.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct TaskStateSegment {
    reserved0: u32,
    pub rsp: [u64; 3],
    reserved1: u64,
    pub ist: [u64; 7],
    reserved2: u64,
    reserved3: u16,
    io_map_base: u16,
}

impl TaskStateSegment {
    pub const fn new() -> TaskStateSegment {
        TaskStateSegment {
            reserved0: 0,
            rsp: [0; 3],
            reserved1: 0,
            ist: [0; 7],
            reserved2: 0,
            reserved3: 0,
            // The bitmap would start past the segment's end: there is none.
            io_map_base: core::mem::size_of::<TaskStateSegment>() as u16,
        }
    }

    /// The two GDT entries that describe a TSS at `base`: present, 64-bit available.
    pub fn descriptor(base: u64) -> [u64; 2] {
        let limit = core::mem::size_of::<TaskStateSegment>() as u64 - 1;
        let low = (limit & 0xffff) | (base & 0xff_ffff) << 16 | 0x89 << 40 | ((limit >> 16) & 0xf) << 48 | ((base >> 24) & 0xff) << 56;
        [low, base >> 32]
    }
}

impl Default for TaskStateSegment {
    fn default() -> Self {
        Self::new()
    }
}
