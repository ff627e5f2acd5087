//! Entry points, descriptor tables, boot page tables and stacks.
//!
//! Four ways in, all ending in `crate::guest_main(cpu, start_info, how)` on a stack of the
//! vCPU's own:
//! - `start64`, the ELF entry: a 64-bit direct start (`boot.start = "direct64"`); every vCPU may
//!   enter here at once, `RDI` = vCPU index, `RSI` = `hvm_start_info`.
//! - `linux_start64`, at image start + 0x200: the Linux boot protocol's 64-bit entry, taken when
//!   the image's loadable bytes are wrapped in a bzImage; `RSI` = the zero page.
//! - `pvh_start32`, the Xen PVH note's entry: 32-bit protected mode, paging off, `EBX` =
//!   `hvm_start_info`; the boot processor only.
//! - `ap_trampoline_*`, copied below 1 MiB by the `sipi` test: an application processor woken by
//!   INIT/SIPI/SIPI starts there in real mode; it takes the next free CPU number.
//!
//! The page tables are static data (an identity map of the low 4 GiB with 2 MiB pages, the last
//! GiB uncached for the LAPIC and device windows), so no boot path runs a table-building loop:
//! every kernel-mode instruction is emulated on PVM.

use core::arch::global_asm;

/// The most vCPUs the guest has stacks for.
pub const MAX_CPUS: usize = 16;
pub const STACK_SIZE: usize = 16 * 1024;

/// How the current vCPU got here (the third argument of `guest_main`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
pub enum BootPath {
    Direct64 = 0,
    Pvh = 1,
    Sipi = 2,
    Linux = 3,
}

impl BootPath {
    pub fn from_raw(raw: u64) -> BootPath {
        match raw {
            1 => BootPath::Pvh,
            2 => BootPath::Sipi,
            3 => BootPath::Linux,
            _ => BootPath::Direct64,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BootPath::Direct64 => "direct64",
            BootPath::Pvh => "pvh",
            BootPath::Sipi => "sipi",
            BootPath::Linux => "linux",
        }
    }
}

extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_end: u8;
    static mut region_pdpt: [u64; 512];
    static mut region_pd: [u64; 512];
    static mut region_page_tables: [[u64; 512]; REGION_PAGE_TABLES];
}

/// Page tables available for mapping run-time regions: 4 tables of 4 KiB pages, 8 MiB.
pub const REGION_PAGE_TABLES: usize = 4;

/// The AP trampoline's code, to be copied to a page below 1 MiB.
pub fn ap_trampoline() -> &'static [u8] {
    // SAFETY: both symbols delimit the trampoline in the image's text.
    unsafe {
        let start = &raw const ap_trampoline_start;
        let end = &raw const ap_trampoline_end;
        core::slice::from_raw_parts(start, end as usize - start as usize)
    }
}

/// The static tables behind the run-time region window (see `paging.rs`).
pub fn region_tables() -> (*mut [u64; 512], *mut [u64; 512], *mut [[u64; 512]; REGION_PAGE_TABLES]) {
    (&raw mut region_pdpt, &raw mut region_pd, &raw mut region_page_tables)
}

global_asm!(
    r#"
    .set MAX_CPUS, {max_cpus}
    .set STACK_SIZE, {stack_size}
    .set CR0_PE, 0x1
    .set CR0_PG, 0x80000000
    .set CR4_PAE, 0x20
    .set MSR_EFER, 0xc0000080
    .set EFER_LME_NXE, 0x900
    .set SELECTOR_CODE64, 0x08
    .set SELECTOR_DATA, 0x10
    .set SELECTOR_CODE32, 0x18

    /* Xen PVH note: name "Xen", type 18 (XEN_ELFNOTE_PHYS32_ENTRY), a 32-bit entry address. */
    .section .note.Xen, "a"
    .balign 4
    .long 4
    .long 4
    .long 18
    .asciz "Xen"
    .long pvh_start32

    .section .text.boot, "ax"
    .code64

    /* Linux boot protocol 64-bit entry (a bzImage wrapping this image): the protocol puts it
       0x200 bytes into the protected-mode image, which is loaded at 1 MiB; RSI = zero page.
       The bytes before it are never executed. */
    .org 0x200, 0xcc
    .global linux_start64
linux_start64:
    xor %edi, %edi
    mov $3, %edx
    jmp boot64

    /* 64-bit direct start: RDI = vCPU index, RSI = start_info. */
    .global start64
start64:
    xor %edx, %edx
    /* Our own GDT and page tables; RDI, RSI, RDX are kept for enter_rust. */
boot64:
    cli
    lgdt gdt_descriptor(%rip)
    mov $SELECTOR_DATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    lea boot_pml4(%rip), %rax
    mov %rax, %cr3
    jmp enter_rust

    /* Common tail: RDI = CPU number, RSI = start_info, RDX = boot path. */
enter_rust:
    cmp $MAX_CPUS, %rdi
    jae park
    lea 1(%rdi), %rax
    imul $STACK_SIZE, %rax
    lea cpu_stacks(%rip), %rsp
    add %rax, %rsp
    xor %ebp, %ebp
    call {guest_main}
park:
    cli
    hlt
    jmp park

    /* Turns on long mode from 32-bit protected mode with flat segments; jumps to \target. */
    .macro ENTER_LONG_MODE target
    mov %cr4, %eax
    or $CR4_PAE, %eax
    mov %eax, %cr4
    mov $boot_pml4, %eax
    mov %eax, %cr3
    mov $MSR_EFER, %ecx
    rdmsr
    or $EFER_LME_NXE, %eax
    wrmsr
    mov %cr0, %eax
    or $(CR0_PG | CR0_PE), %eax
    mov %eax, %cr0
    ljmp $SELECTOR_CODE64, $\target
    .endm

    /* PVH entry: 32-bit protected mode, paging off, EBX = start_info. */
    .code32
    .global pvh_start32
pvh_start32:
    cli
    lgdt gdt_descriptor
    mov $SELECTOR_DATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    ENTER_LONG_MODE pvh_start64

    .code64
pvh_start64:
    xor %edi, %edi
    mov %ebx, %esi
    mov $1, %edx
    jmp enter_rust

    /* Application processors arrive here from the real-mode trampoline. */
    .code32
ap_start32:
    mov $SELECTOR_DATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    ENTER_LONG_MODE ap_start64

    .code64
ap_start64:
    mov $1, %edi
    lock xadd %edi, next_cpu_number(%rip)
    xor %esi, %esi
    mov $2, %edx
    jmp enter_rust

    /* Real-mode trampoline, copied to (SIPI vector << 12); CS = vector << 8, IP = 0. Only
       position-independent 16-bit code and data addressed relative to its own start. */
    .code16
    .global ap_trampoline_start
ap_trampoline_start:
    cli
    mov %cs, %ax
    mov %ax, %ds
    lgdtl (ap_trampoline_gdt_descriptor - ap_trampoline_start)
    mov %cr0, %eax
    or $CR0_PE, %eax
    mov %eax, %cr0
    ljmpl $SELECTOR_CODE32, $ap_start32
    .balign 8
ap_trampoline_gdt_descriptor:
    .word gdt_end - gdt - 1
    .long gdt
    .global ap_trampoline_end
ap_trampoline_end:
    .code64

    .section .rodata
    .balign 16
    /* Same selectors as the GDT the VMM builds: null, 64-bit code, data, 32-bit code. */
gdt:
    .quad 0
    .quad 0x00af9a000000ffff
    .quad 0x00cf92000000ffff
    .quad 0x00cf9a000000ffff
gdt_end:
    .balign 8
    .word 0
gdt_descriptor:
    .word gdt_end - gdt - 1
    .quad gdt

    .section .data.pagetables, "aw"
    .balign 4096
    .global boot_pml4
boot_pml4:
    .quad boot_pdpt + 0x3
    .quad region_pdpt + 0x3
    .fill 510, 8, 0
boot_pdpt:
    .quad boot_page_directories + 0x0003
    .quad boot_page_directories + 0x1003
    .quad boot_page_directories + 0x2003
    .quad boot_page_directories + 0x3003
    .fill 508, 8, 0
    /* 2048 entries of 2 MiB: present, writable, large; the 4th GiB also PWT|PCD (MMIO). */
boot_page_directories:
    .set address, 0
    .rept 1536
    .quad address + 0x83
    .set address, address + 0x200000
    .endr
    .rept 512
    .quad address + 0x9b
    .set address, address + 0x200000
    .endr

    .section .data
    .balign 4
next_cpu_number:
    .long 1

    .section .bss
    .balign 4096
    .global region_pdpt
region_pdpt:
    .space 4096
    .global region_pd
region_pd:
    .space 4096
    .global region_page_tables
region_page_tables:
    .space 4096 * {region_page_tables}
    .balign 16
cpu_stacks:
    .space MAX_CPUS * STACK_SIZE
"#,
    max_cpus = const MAX_CPUS,
    stack_size = const STACK_SIZE,
    region_page_tables = const REGION_PAGE_TABLES,
    guest_main = sym crate::guest_main,
    options(att_syntax)
);
