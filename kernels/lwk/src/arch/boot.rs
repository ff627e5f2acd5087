//! First instructions: the PVH 32-bit entry and the 64-bit direct entry both end up on the
//! boot stack in the higher half, calling `kernel_main(start_info_phys)`. In a 64-bit direct
//! start every vCPU enters at once with its index in RDI: vCPU 0 boots, the others run
//! `ap_main(index)` on their own stacks.
//!
//! The boot page tables are static data: they identity-map the low 1 GiB (so the stub keeps
//! running when paging turns on), map the same 1 GiB at the physical-memory window
//! (`PHYSMAP_BASE`) and at the kernel image window (`KERNEL_VMA`). They stay the kernel's
//! page tables: `mm` only extends the window when there is memory above 1 GiB, because every
//! kernel instruction spent rebuilding them is emulated on PVM. User address spaces share
//! entries 256..512 and never see the identity map.

core::arch::global_asm!(
    r#"
    /* XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit physical entry, as 8 bytes (upper half zero) in a
       4-aligned note, the form both QEMU and rust-vmm's linux-loader accept. */
    .section .note.Xen, "a", @note
    .balign 4
    .long 4
    .long 8
    .long 18
    .asciz "Xen"
    .balign 4
    .quad pvh_entry32
    .balign 4

    .section .boot.text, "ax"
    .code32
    .global pvh_entry32
pvh_entry32:
    /* Protected mode, paging off, EBX = hvm_start_info, ESP undefined: use no stack here. */
    cli
    cld
    movl $1, booted_via_pvh
    mov %ebx, %esi
    xor %edi, %edi                     /* this is vCPU 0 */
    mov %cr4, %eax
    or $0x20, %eax                     /* PAE */
    mov %eax, %cr4
    mov $boot_pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx              /* EFER */
    rdmsr
    or $0x901, %eax                    /* SCE | LME | NXE */
    wrmsr
    mov %cr0, %eax
    or $0x80010001, %eax               /* PG | WP | PE */
    mov %eax, %cr0
    lgdt boot_gdt_pointer
    ljmp $0x08, $boot_entry64

    .code64
    .global boot_entry64
boot_entry64:
    /* Reached from the stub above, or directly as the ELF entry in a 64-bit start
       (RDI = vCPU index, RSI = hvm_start_info, RSP = 0). Only vCPU 0 boots the kernel; the
       others park until SMP support brings them in. */
    cli
    cmp ${max_cpus}, %rdi
    jae 3f                             /* more vCPUs than the kernel handles: park */
    mov $boot_pml4, %eax
    mov %rax, %cr3
    mov %rsi, %r12
    mov %rdi, %r13                     /* EFER: make sure NXE and SCE are on in both paths */
    mov $0xc0000080, %ecx
    rdmsr
    or $0x901, %eax
    wrmsr
    mov %cr0, %rax
    or $0x10000, %eax                  /* WP */
    mov %rax, %cr0
    lgdt boot_gdt_pointer
    mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    xor %eax, %eax
    mov %eax, %fs
    mov %eax, %gs
    movabs $boot_stack_top, %rsp
    test %r13, %r13
    jz 4f
    movabs $ap_stacks, %rsp            /* vCPU n > 0: the n-th AP stack */
    mov %r13, %rax
    shl ${ap_stack_shift}, %rax
    add %rax, %rsp
4:  pushq $0x08
    movabs $1f, %rax
    push %rax
    lretq                              /* reload CS and jump to the higher half at once */
1:
    xor %ebp, %ebp
    test %r13, %r13
    jnz 5f
    mov %r12, %rdi
    call kernel_main
5:  mov %r13, %rdi
    call ap_main
2:  hlt
    jmp 2b
3:  hlt
    jmp 3b

    /* The other CPUs of a PVH boot start here after INIT/SIPI (copied to AP_TRAMPOLINE, real
       mode, CS = AP_TRAMPOLINE >> 4): protected mode, long mode on the boot page tables,
       then boot_entry64 with the next CPU index in RDI. Addresses are computed for the copy. */
    .code16
    .balign 16
    .global ap_trampoline_start, ap_trampoline_end
ap_trampoline_start:
    cli
    cld
    xor %ax, %ax
    mov %ax, %ds
    lgdtl {trampoline} + ap_trampoline_gdt_pointer - ap_trampoline_start
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmpl $0x18, ${trampoline} + ap_trampoline_32 - ap_trampoline_start
    .code32
ap_trampoline_32:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %cr4, %eax
    or $0x20, %eax                     /* PAE */
    mov %eax, %cr4
    mov $boot_pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx              /* EFER: SCE | LME | NXE */
    rdmsr
    or $0x901, %eax
    wrmsr
    mov %cr0, %eax
    or $0x80010001, %eax               /* PG | WP | PE */
    mov %eax, %cr0
    ljmp $0x08, ${trampoline} + ap_trampoline_64 - ap_trampoline_start
    .code64
ap_trampoline_64:
    mov $1, %edi
    lock xadd %edi, {trampoline} + ap_next_index - ap_trampoline_start
    xor %esi, %esi
    mov $boot_entry64, %eax
    jmp *%rax
    .balign 8
ap_trampoline_gdt:
    .quad 0
    .quad 0x00af9a000000ffff           /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff           /* 0x10: data */
    .quad 0x00cf9a000000ffff           /* 0x18: 32-bit code */
ap_trampoline_gdt_pointer:
    .word 31
    .long {trampoline} + ap_trampoline_gdt - ap_trampoline_start
ap_next_index:
    .long 1                            /* CPU 0 is the boot CPU */
ap_trampoline_end:

    .section .boot.data, "aw"
    .global booted_via_pvh
booted_via_pvh:
    .long 0
    .balign 4096
    .global boot_pml4
boot_pml4:
    .quad boot_pdpt_low + 3
    .fill 255, 8, 0
    .quad boot_pdpt_low + 3            /* PHYSMAP_BASE */
    .fill 254, 8, 0
    .quad boot_pdpt_high + 3           /* KERNEL_VMA */
boot_pdpt_low:
    .quad boot_pd + 3
    .fill 511, 8, 0
boot_pdpt_high:
    .fill 510, 8, 0
    .quad boot_pd + 3
    .quad 0
boot_pd:
    .set boot_pd_index, 0
    .rept 512
    .quad (boot_pd_index << 21) + 0x183 /* present, writable, 2 MiB, global */
    .set boot_pd_index, boot_pd_index + 1
    .endr
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff           /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff           /* 0x10: data */
boot_gdt_pointer:
    .word boot_gdt_pointer - boot_gdt - 1
    .quad boot_gdt

    /* Large enough for unoptimised builds, whose frames hold every temporary. */
    .section .bss.boot_stack, "aw", @nobits
    .balign 16
    .space 262144
boot_stack_top:

    /* The other CPUs' first stacks, which become their idle loops' stacks; stack n ends at
       ap_stacks + n * size (n >= 1). */
    .section .bss.ap_stacks, "aw", @nobits
    .balign 16
ap_stacks:
    .space {ap_stack_size} * ({max_cpus} - 1)
    .text
"#,
    max_cpus = const super::tables::MAX_CPUS,
    trampoline = const AP_TRAMPOLINE,
    ap_stack_shift = const AP_STACK_SHIFT,
    ap_stack_size = const 1u64 << AP_STACK_SHIFT,
    options(att_syntax)
);

/// Each AP's boot (and idle) stack is 32 KiB.
const AP_STACK_SHIFT: u32 = 15;

/// Where the AP start-up code is copied: a free page below 1 MiB (the guest ABI leaves
/// 0x8000 unused) whose page number is the SIPI vector.
pub const AP_TRAMPOLINE: u64 = 0x8000;

extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_end: u8;
    static booted_via_pvh: u32;
}

/// True if the boot came through the PVH entry, whose other CPUs wait for INIT/SIPI (in a
/// 64-bit direct start they are running already).
pub fn other_cpus_wait_for_sipi() -> bool {
    // SAFETY: written once by the boot stub before any Rust code runs.
    unsafe { core::ptr::read_volatile(&raw const booted_via_pvh) != 0 }
}

/// Copies the AP start-up code to `AP_TRAMPOLINE`.
pub fn install_ap_trampoline() {
    let start = &raw const ap_trampoline_start as u64;
    let len = (&raw const ap_trampoline_end as u64 - start) as usize;
    // The boot text sits at its physical address, which the physical window also maps.
    super::phys::bytes_mut(AP_TRAMPOLINE, len).copy_from_slice(super::phys::bytes(start, len));
}

/// The symbols the boot stub calls: the kernel's entry on CPU 0 (the PVH start-info address)
/// and on each other vCPU of a 64-bit direct start (its index).
#[no_mangle]
extern "C" fn kernel_main(start_info: u64) -> ! {
    crate::kernel_main(start_info)
}

#[no_mangle]
extern "C" fn ap_main(cpu: u64) -> ! {
    crate::ap_main(cpu)
}
