//! GDT, TSS, IDT and the per-CPU block reached through GS: one of each per CPU, the IDT shared.

use super::cpu::{self, MSR_GS_BASE, MSR_KERNEL_GS_BASE, MSR_LSTAR, MSR_SFMASK, MSR_STAR};
use core::arch::asm;
use core::mem::size_of;
use guest_arch::TaskStateSegment;

/// The flags SYSCALL clears (SFMASK): IF, TF, DF, AC, NT, IOPL.
pub const SYSCALL_FLAGS_MASK: u64 = 0x4_7700;
/// The interrupt flag, which SYSCALL must leave set where it stays in ring 3: ring-3 code
/// cannot set it again (POPFQ ignores it there), and on PVM no interrupt reaches a ring-3
/// thread while it is clear (the fast calls return to the job with POPFQ).
pub const INTERRUPT_FLAG: u64 = 1 << 9;

pub const KERNEL_CODE: u16 = 0x08;
pub const KERNEL_DATA: u16 = 0x10;
/// User selectors in the order SYSRET requires: data at STAR.base + 8, code at + 16.
pub const USER_DATA: u16 = 0x18 | 3;
pub const USER_CODE: u16 = 0x20 | 3;
const TSS_SELECTOR: u16 = 0x28;

const TRAP_STACK_SIZE: usize = 64 * 1024;
const DOUBLE_FAULT_STACK_SIZE: usize = 16 * 1024;
/// The most CPUs the kernel brings up.
pub const MAX_CPUS: usize = 16;

#[repr(C, align(16))]
struct Stack<const N: usize>([u8; N]);

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

/// What the entry code finds at `%gs:offset` after SWAPGS; the offsets are used by `trap.rs`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PerCpu {
    self_pointer: u64,
    /// Offset 8: the stack the SYSCALL path switches to (the same as TSS.RSP0).
    trap_stack_top: u64,
    /// Offset 16: user RSP saved by the SYSCALL path before it switches stacks.
    user_rsp_scratch: u64,
    cpu_index: u64,
}

/// The main thread's kernel stack (it starts on CPU 0).
static mut TRAP_STACK: Stack<TRAP_STACK_SIZE> = Stack([0; TRAP_STACK_SIZE]);
static mut DOUBLE_FAULT_STACKS: [Stack<DOUBLE_FAULT_STACK_SIZE>; MAX_CPUS] = [const { Stack([0; DOUBLE_FAULT_STACK_SIZE]) }; MAX_CPUS];
static mut TSS: [TaskStateSegment; MAX_CPUS] = [TaskStateSegment::new(); MAX_CPUS];
static mut GDT: [[u64; 7]; MAX_CPUS] = [[
    0,
    0x00af_9a00_0000_ffff, // kernel code, 64-bit
    0x00cf_9200_0000_ffff, // kernel data
    0x00cf_f200_0000_ffff, // user data
    0x00af_fa00_0000_ffff, // user code, 64-bit
    0,                     // TSS, low half (filled in at init)
    0,                     // TSS, high half
]; MAX_CPUS];
static mut IDT: [IdtEntry; 256] =
    [IdtEntry { offset_low: 0, selector: 0, ist: 0, attributes: 0, offset_mid: 0, offset_high: 0, reserved: 0 }; 256];
static mut PER_CPU: [PerCpu; MAX_CPUS] = [PerCpu { self_pointer: 0, trap_stack_top: 0, user_rsp_scratch: 0, cpu_index: 0 }; MAX_CPUS];

#[repr(C, packed)]
struct DescriptorPointer {
    limit: u16,
    base: u64,
}

/// The top of the main thread's kernel stack; `enter_user` builds its frame there.
pub fn trap_stack_top() -> u64 {
    (&raw const TRAP_STACK) as u64 + TRAP_STACK_SIZE as u64
}

/// The stack traps from user mode land on while the current thread of `cpu` runs.
pub fn set_kernel_stack(cpu: usize, top: u64) {
    // SAFETY: only `cpu` itself changes its own entries, with interrupts off.
    unsafe {
        TSS[cpu].rsp[0] = top;
        PER_CPU[cpu].trap_stack_top = top;
    }
}

/// The stack traps from user mode land on for `cpu` (what `set_kernel_stack` set last).
pub fn kernel_stack(cpu: usize) -> u64 {
    // SAFETY: a plain read of this CPU's own entry, with interrupts off.
    unsafe { PER_CPU[cpu].trap_stack_top }
}

/// Where `cpu`'s TSS keeps RSP0 (unaligned: the TSS is packed), for the entry code that
/// points it at the running kernel stack while a ring-3 stub runs (`fpu`).
pub fn kernel_stack_field(cpu: usize) -> *mut u64 {
    // SAFETY: only the address is taken.
    unsafe { (&raw mut TSS[cpu].rsp).cast::<u64>() }
}

/// The index of the CPU running this code: each CPU has its own GDT, and SGDT tells which
/// (RDTSCP's TSC_AUX would need a CPUID bit that PVM does not show the kernel).
pub fn current_cpu() -> usize {
    let mut pointer = DescriptorPointer { limit: 0, base: 0 };
    // SAFETY: SGDT only stores the GDT register into `pointer`.
    unsafe { asm!("sgdt [{}]", in(reg) &raw mut pointer, options(nostack, preserves_flags)) }
    let base = pointer.base;
    let first = (&raw const GDT) as u64;
    ((base - first) / size_of::<[u64; 7]>() as u64) as usize
}

/// Fills the IDT (shared by all CPUs) and loads CPU 0's tables.
pub fn init_boot_cpu() {
    let stubs = super::trap::exception_stubs_start();
    let gate = |handler: u64, dpl: u8, ist: u8| IdtEntry {
        offset_low: handler as u16,
        selector: KERNEL_CODE,
        ist,
        attributes: 0x8e | dpl << 5, // present interrupt gate
        offset_mid: (handler >> 16) as u16,
        offset_high: (handler >> 32) as u32,
        reserved: 0,
    };
    // SAFETY: runs once on the boot CPU before any other CPU runs kernel code.
    unsafe {
        let idt = (&raw mut IDT).cast::<IdtEntry>();
        for vector in 0..32 {
            let handler = stubs + vector as u64 * super::trap::EXCEPTION_STUB_SIZE;
            // Breakpoint may be raised by user `int3` (DPL 3); the double fault gets its own
            // stack so a kernel stack overflow still produces a report.
            idt.add(vector).write(gate(handler, if vector == 3 { 3 } else { 0 }, if vector == 8 { 1 } else { 0 }));
        }
        idt.add(super::apic::WAKE_VECTOR).write(gate(super::apic::wake_handler(), 0, 0));
        idt.add(super::apic::TICK_VECTOR).write(gate(super::trap::tick_handler(), 0, 0));
        idt.add(super::apic::SPURIOUS_VECTOR).write(gate(super::apic::spurious_handler(), 0, 0));
    }
    init_cpu(0, trap_stack_top());
}

/// Loads `cpu`'s GDT, TSS and per-CPU block, the shared IDT and the SYSCALL MSRs.
pub fn init_cpu(cpu: usize, trap_stack_top: u64) {
    // SAFETY: each CPU writes only its own entries, once, before it takes any trap; the
    // tables' addresses stay valid for the kernel's life.
    unsafe {
        let double_fault_top = (&raw const DOUBLE_FAULT_STACKS[cpu]) as u64 + DOUBLE_FAULT_STACK_SIZE as u64;
        TSS[cpu].rsp[0] = trap_stack_top;
        TSS[cpu].ist[0] = double_fault_top;

        [GDT[cpu][5], GDT[cpu][6]] = TaskStateSegment::descriptor((&raw const TSS[cpu]) as u64);
        let gdt_pointer = DescriptorPointer { limit: size_of::<[u64; 7]>() as u16 - 1, base: (&raw const GDT[cpu]) as u64 };
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
        let idt_pointer = DescriptorPointer { limit: size_of::<[IdtEntry; 256]>() as u16 - 1, base: (&raw const IDT) as u64 };
        asm!("lidt [{}]", in(reg) &idt_pointer, options(nostack));

        PER_CPU[cpu].self_pointer = (&raw const PER_CPU[cpu]) as u64;
        PER_CPU[cpu].trap_stack_top = trap_stack_top;
        PER_CPU[cpu].cpu_index = cpu as u64;
    }
    // GS holds the user's base (zero at first) everywhere; the ring-0 SYSCALL entry swaps in
    // the per-CPU block only to find its stack.
    cpu::write_msr(MSR_GS_BASE, 0);
    // SAFETY: only the address is taken.
    cpu::write_msr(MSR_KERNEL_GS_BASE, unsafe { (&raw const PER_CPU[cpu]) as u64 });

    // SYSRET would take user SS from STAR[63:48] + 8 and CS from + 16 (0x18, 0x20).
    cpu::write_msr(MSR_STAR, (KERNEL_DATA as u64) << 48 | (KERNEL_CODE as u64) << 32);
    cpu::write_msr(MSR_LSTAR, super::trap::syscall_entry_address());
    cpu::write_msr(MSR_SFMASK, SYSCALL_FLAGS_MASK);
}
