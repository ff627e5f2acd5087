//! GDT, TSS, IDT and the per-CPU block reached through GS: loaded once on the boot CPU.

use super::cpu::{self, MSR_GS_BASE, MSR_KERNEL_GS_BASE, MSR_LSTAR, MSR_SFMASK, MSR_STAR};
use core::arch::asm;
use core::mem::size_of;

pub const KERNEL_CODE: u16 = 0x08;
pub const KERNEL_DATA: u16 = 0x10;
/// User selectors in the order SYSRET requires: data at STAR.base + 8, code at + 16.
pub const USER_DATA: u16 = 0x18 | 3;
pub const USER_CODE: u16 = 0x20 | 3;
const TSS_SELECTOR: u16 = 0x28;

const TRAP_STACK_SIZE: usize = 64 * 1024;
const DOUBLE_FAULT_STACK_SIZE: usize = 16 * 1024;

#[repr(C, align(16))]
struct Stack<const N: usize>([u8; N]);

#[repr(C, packed)]
struct TaskStateSegment {
    reserved0: u32,
    rsp: [u64; 3],
    reserved1: u64,
    ist: [u64; 7],
    reserved2: u64,
    reserved3: u16,
    io_map_base: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct IdtEntry {
    offset_low: u16,
    selector: u16,
    ist: u8,
    attributes: u8,
    offset_mid: u16,
    offset_high: u32,
    reserved: u32,
}

/// What the entry code finds at `%gs:offset`; the offsets are used by `trap.rs`.
#[repr(C)]
pub struct PerCpu {
    self_pointer: u64,
    /// Offset 8: the stack the SYSCALL path switches to (the same as TSS.RSP0).
    trap_stack_top: u64,
    /// Offset 16: user RSP saved by the SYSCALL path before it switches stacks.
    user_rsp_scratch: u64,
    cpu_index: u64,
}

static mut TRAP_STACK: Stack<TRAP_STACK_SIZE> = Stack([0; TRAP_STACK_SIZE]);
static mut DOUBLE_FAULT_STACK: Stack<DOUBLE_FAULT_STACK_SIZE> = Stack([0; DOUBLE_FAULT_STACK_SIZE]);
static mut TSS: TaskStateSegment = TaskStateSegment {
    reserved0: 0,
    rsp: [0; 3],
    reserved1: 0,
    ist: [0; 7],
    reserved2: 0,
    reserved3: 0,
    io_map_base: size_of::<TaskStateSegment>() as u16, // no I/O bitmap: user port I/O faults
};
static mut GDT: [u64; 7] = [
    0,
    0x00af_9a00_0000_ffff, // kernel code, 64-bit
    0x00cf_9200_0000_ffff, // kernel data
    0x00cf_f200_0000_ffff, // user data
    0x00af_fa00_0000_ffff, // user code, 64-bit
    0,                     // TSS, low half (filled in at init)
    0,                     // TSS, high half
];
static mut IDT: [IdtEntry; 32] = [IdtEntry {
    offset_low: 0,
    selector: 0,
    ist: 0,
    attributes: 0,
    offset_mid: 0,
    offset_high: 0,
    reserved: 0,
}; 32];
static mut PER_CPU: PerCpu = PerCpu { self_pointer: 0, trap_stack_top: 0, user_rsp_scratch: 0, cpu_index: 0 };

#[repr(C, packed)]
struct DescriptorPointer {
    limit: u16,
    base: u64,
}

/// The top of the stack traps from user mode run on; `enter_user` builds its frame there.
pub fn trap_stack_top() -> u64 {
    (&raw const TRAP_STACK) as u64 + TRAP_STACK_SIZE as u64
}

/// The stack traps from user mode land on while the current thread runs.
pub fn set_kernel_stack(top: u64) {
    // SAFETY: one CPU, interrupts off: nothing reads these fields while they change.
    unsafe {
        TSS.rsp[0] = top;
        PER_CPU.trap_stack_top = top;
    }
}

pub fn init_boot_cpu() {
    let trap_stack_top = trap_stack_top();
    // SAFETY: runs once on the boot CPU before any trap or user entry, so nothing else reads
    // these tables while they are written; their addresses stay valid for the kernel's life.
    unsafe {
        let double_fault_top = (&raw const DOUBLE_FAULT_STACK) as u64 + DOUBLE_FAULT_STACK_SIZE as u64;
        TSS.rsp[0] = trap_stack_top;
        TSS.ist[0] = double_fault_top;

        let tss_base = (&raw const TSS) as u64;
        let tss_limit = size_of::<TaskStateSegment>() as u64 - 1;
        GDT[5] = tss_limit
            | (tss_base & 0xff_ffff) << 16
            | 0x89 << 40 // present, 64-bit available TSS
            | ((tss_base >> 24) & 0xff) << 56;
        GDT[6] = tss_base >> 32;
        let gdt_pointer = DescriptorPointer { limit: size_of::<[u64; 7]>() as u16 - 1, base: (&raw const GDT) as u64 };
        asm!(
            "lgdt [{gdt}]",
            "mov ss, {data:x}",
            "mov ds, {data:x}",
            "mov es, {data:x}",
            "push {code}",
            "lea {scratch}, [rip + 2f]",
            "push {scratch}",
            "retfq",
            "2:",
            "ltr {tss:x}",
            gdt = in(reg) &gdt_pointer,
            data = in(reg) KERNEL_DATA as u64,
            code = const KERNEL_CODE as u64,
            tss = in(reg) TSS_SELECTOR as u64,
            scratch = out(reg) _,
        );

        let stubs = super::trap::exception_stubs_start();
        for vector in 0..32 {
            let handler = stubs + vector as u64 * super::trap::EXCEPTION_STUB_SIZE;
            // Breakpoint may be raised by user `int3` (DPL 3); the double fault gets its own
            // stack so a kernel stack overflow still produces a report.
            let dpl = if vector == 3 { 3 } else { 0 };
            IDT[vector] = IdtEntry {
                offset_low: handler as u16,
                selector: KERNEL_CODE,
                ist: if vector == 8 { 1 } else { 0 },
                attributes: 0x8e | dpl << 5,
                offset_mid: (handler >> 16) as u16,
                offset_high: (handler >> 32) as u32,
                reserved: 0,
            };
        }
        let idt_pointer = DescriptorPointer { limit: size_of::<[IdtEntry; 32]>() as u16 - 1, base: (&raw const IDT) as u64 };
        asm!("lidt [{}]", in(reg) &idt_pointer, options(nostack));

        PER_CPU.self_pointer = (&raw const PER_CPU) as u64;
        PER_CPU.trap_stack_top = trap_stack_top;
        PER_CPU.cpu_index = 0;
    }
    // GS holds the user's base (zero at first) everywhere; the ring-0 SYSCALL entry swaps in
    // the per-CPU block only to find its stack.
    cpu::write_msr(MSR_GS_BASE, 0);
    cpu::write_msr(MSR_KERNEL_GS_BASE, (&raw const PER_CPU) as u64);

    cpu::write_msr(MSR_STAR, (KERNEL_DATA as u64) << 48 | (KERNEL_CODE as u64) << 32);
    cpu::write_msr(MSR_LSTAR, super::trap::syscall_entry_address());
    // Cleared on entry: IF, TF, DF, AC, NT.
    cpu::write_msr(MSR_SFMASK, 0x4_7700);
}
