//! Ring 3: just enough to run one piece of code in user mode and get back.
//!
//! On PVM every kernel-mode instruction is emulated (~0.26 us each) while user-mode code runs
//! natively, so a loop that polls shared memory belongs in ring 3. This module provides:
//! - a GDT of our own (the boot one is read-only data shared with the AP trampoline) with the
//!   kernel selectors at the boot values plus user data (0x23), user code (0x2b) and a TSS;
//! - the TSS, whose RSP0 is the kernel stack of the caller of [`run_in_user_mode`], so
//!   exceptions from ring 3 land on it;
//! - the way back, [`leave_user_mode`]: a `ud2` at a known address in the user image, which our
//!   #UD handler recognises and answers with a `longjmp` to the kernel stack of the caller of
//!   [`run_in_user_mode`]. Not `int $n` through a DPL-3 gate: on PVM a software interrupt from
//!   user mode raised #UD (`int $0x80` and `int $0x81` alike), while `ud2` arrives as #UD
//!   everywhere;
//! - a user stack, page aligned so exactly its pages can be made user-accessible;
//! - port writes from ring 3: RFLAGS.IOPL is 3, so on hardware and under QEMU `out` just works.
//!   On PVM (measured here) it raises #GP all the same; our #GP handler then completes an
//!   `out %eax, (%dx)` to the one port the kernel allowed ([`permit_port_write`]) and resumes
//!   after it, as Xen does for its PV guests' virtual IOPL.
//!
//! The caller must make the code, the stack ([`user_stack_range`]) and whatever data the user
//! code touches user-accessible in the page tables (`paging::allow_user_access`); the linker
//! script gathers user code and its read-only data between `user_image_start` and
//! `user_image_end` ([`user_image_range`]). Code that runs in ring 3 must not call into kernel
//! text: anything it calls is in that range or inlined (hence `#[inline(always)]` on
//! [`leave_user_mode`] and on `arch::outl`). If it does, or touches kernel data, it takes a page
//! fault, which the exception handler reports as usual.
//!
//! One vCPU at a time (vCPU 0 in the tests).

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use guest_arch::TaskStateSegment;

/// Selector values: index << 3 | requested privilege level.
const KERNEL_DATA_SELECTOR: u16 = 0x10;
pub const USER_DATA_SELECTOR: u16 = 0x20 | 3;
pub const USER_CODE_SELECTOR: u16 = 0x28 | 3;
const TSS_SELECTOR: u16 = 0x30;
/// Interrupts stay off in ring 3 (the polling loop needs none, as in ring 0); IOPL 3 lets user
/// code ring the doorbell port with `out`. Bit 1 is reserved and always set.
const USER_RFLAGS: u64 = (3 << 12) | 0x2;
pub const USER_STACK_SIZE: usize = 16 * 1024;

/// The TSS: only RSP0 matters here (no IST, no I/O bitmap: IOPL 3 allows all ports).
static mut TSS: TaskStateSegment = TaskStateSegment::new();

#[repr(C, align(16))]
struct Gdt([u64; 8]);

/// Writable (`ltr` sets the busy bit in the TSS descriptor); the TSS descriptor is filled in at
/// run time because its base is split across bit fields no relocation can express.
static mut GDT: Gdt = Gdt([
    0,
    0x00af_9a00_0000_ffff, // 0x08 kernel code, 64-bit (as in the boot GDT)
    0x00cf_9200_0000_ffff, // 0x10 kernel data
    0x00cf_9a00_0000_ffff, // 0x18 kernel code, 32-bit
    0x00cf_f200_0000_ffff, // 0x20 user data, DPL 3
    0x00af_fa00_0000_ffff, // 0x28 user code, 64-bit, DPL 3
    0,                     // 0x30 TSS, low half
    0,                     //      TSS, high half
]);

#[repr(C, align(4096))]
struct UserStack([u8; USER_STACK_SIZE]);

static mut USER_STACK: UserStack = UserStack([0; USER_STACK_SIZE]);

/// The kernel stack pointer of the `run_in_user_mode` in progress, for the way back.
static KERNEL_RSP_IN_USER_MODE: AtomicU64 = AtomicU64::new(0);
static DESCRIPTORS_LOADED: AtomicBool = AtomicBool::new(false);
/// The port ring 3 may write when the host does not honour IOPL (0: none). Kernel data, so user
/// code cannot change it.
static PORT_WRITABLE_FROM_USER: AtomicU16 = AtomicU16::new(0);
const INVALID_OPCODE_VECTOR: u8 = 6;
const GENERAL_PROTECTION_VECTOR: u8 = 13;

extern "C" {
    static user_image_start: u8;
    static user_image_end: u8;
    fn enter_user_mode(entry: u64, user_stack_pointer: u64, argument: u64, tss_rsp0: *mut u64);
    fn user_invalid_opcode_stub();
    fn user_general_protection_stub();
    /// In the user image: `ud2`.
    fn user_mode_exit() -> !;
}

/// Lets ring 3 write `port` with `out %eax, (%dx)` even where IOPL 3 is not honoured (PVM).
pub fn permit_port_write(port: u16) {
    PORT_WRITABLE_FROM_USER.store(port, Ordering::Relaxed);
}

/// `[start, end)` of the code and read-only data the linker script set aside for ring 3.
pub fn user_image_range() -> (u64, u64) {
    ((&raw const user_image_start) as u64, (&raw const user_image_end) as u64)
}

/// `[start, end)` of the user stack (whole pages).
pub fn user_stack_range() -> (u64, u64) {
    let start = (&raw const USER_STACK) as u64;
    (start, start + USER_STACK_SIZE as u64)
}

/// A 64-bit available-TSS descriptor (type 9, present, DPL 0), as two GDT words.
/// Loads our GDT and TSS and installs the #UD and #GP handlers that know about ring 3, once.
fn load_descriptors_once() {
    if DESCRIPTORS_LOADED.swap(true, Ordering::AcqRel) {
        return;
    }
    #[repr(C, packed)]
    struct Descriptor {
        limit: u16,
        base: u64,
    }
    // SAFETY: one vCPU runs this, once (the flag above), before anything uses the new entries.
    // The kernel selectors keep their boot values and descriptors, so CS and SS stay valid
    // across `lgdt`; `ltr` runs on a TSS descriptor that is not yet busy.
    unsafe {
        let gdt = &raw mut GDT;
        let [low, high] = TaskStateSegment::descriptor((&raw const TSS) as u64);
        (*gdt).0[6] = low;
        (*gdt).0[7] = high;
        let descriptor = Descriptor { limit: (core::mem::size_of::<Gdt>() - 1) as u16, base: gdt as u64 };
        asm!("lgdt [{}]", in(reg) &descriptor, options(readonly, nostack, preserves_flags));
        asm!("ltr {:x}", in(reg) TSS_SELECTOR, options(nostack, preserves_flags));
    }
    super::set_gate(INVALID_OPCODE_VECTOR, user_invalid_opcode_stub as *const () as u64);
    super::set_gate(GENERAL_PROTECTION_VECTOR, user_general_protection_stub as *const () as u64);
}

/// Runs `entry(&mut state)` in ring 3 on the user stack until it calls [`leave_user_mode`];
/// returns the state as user code left it. `state` is moved onto the user stack (so it must be
/// plain data the user code may see; it is not dropped there).
pub fn run_in_user_mode<T>(entry: extern "C" fn(&mut T) -> !, state: T) -> T {
    load_descriptors_once();
    let (stack_bottom, stack_top) = user_stack_range();
    let alignment = core::mem::align_of::<T>().max(16) as u64;
    let state_address = (stack_top - core::mem::size_of::<T>() as u64) & !(alignment - 1);
    assert!(state_address - stack_bottom >= USER_STACK_SIZE as u64 / 2, "state too large for the user stack");
    // At a function's entry RSP + 8 is 16-byte aligned (the call pushed a return address); the
    // entry never returns, so the slot stays empty.
    let user_stack_pointer = state_address - 8;
    // SAFETY: the state goes to the top of our own static user stack, inside its bounds and
    // aligned for T; nothing else uses that stack. `enter_user_mode` saves the callee-saved
    // registers and the stack pointer, points TSS.RSP0 below them, and `iretq`s to `entry` in
    // ring 3; `user_mode_done` (reached from the #UD handler) restores them and returns here. Everything user code can
    // write is the user stack and what the caller made user-accessible.
    unsafe {
        let state_pointer = state_address as *mut T;
        state_pointer.write(state);
        let tss_rsp0 = (&raw mut TSS.rsp) as *mut u64;
        enter_user_mode(entry as *const () as u64, user_stack_pointer, state_address, tss_rsp0);
        state_pointer.read()
    }
}

/// Called from ring 3: ends the [`run_in_user_mode`] that started the caller. Always inlined;
/// the `ud2` it reaches is in the user image.
#[inline(always)]
pub fn leave_user_mode() -> ! {
    // SAFETY: `user_mode_exit` faults at once, and the #UD handler installed by
    // `load_descriptors_once` returns from `run_in_user_mode` instead of to the caller.
    unsafe { user_mode_exit() }
}

global_asm!(
    r#"
    .section .text
    /* enter_user_mode(entry = RDI, user RSP = RSI, argument = RDI for entry = RDX,
                       &TSS.RSP0 = RCX) */
    .global enter_user_mode
enter_user_mode:
    push %rbx
    push %rbp
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, {kernel_rsp}(%rip)
    /* Exceptions from ring 3 push their frame below what we saved. */
    mov %rsp, (%rcx)
    push ${user_data}
    push %rsi
    push ${user_rflags}
    push ${user_code}
    push %rdi
    mov %rdx, %rdi
    /* User code gets no kernel values in registers. */
    xor %eax, %eax
    xor %ebx, %ebx
    xor %ecx, %ecx
    xor %edx, %edx
    xor %esi, %esi
    xor %ebp, %ebp
    xor %r8d, %r8d
    xor %r9d, %r9d
    xor %r10d, %r10d
    xor %r11d, %r11d
    xor %r12d, %r12d
    xor %r13d, %r13d
    xor %r14d, %r14d
    xor %r15d, %r15d
    iretq

    /* #UD: at user_mode_exit in ring 3, the user code is done; anything else goes to the usual
       report. The frame (no error code): RIP, CS, RFLAGS, RSP, SS. */
    .global user_invalid_opcode_stub
user_invalid_opcode_stub:
    testb $3, 8(%rsp)
    jz 1f
    push %rax
    lea user_mode_exit(%rip), %rax
    cmp %rax, 8(%rsp)
    pop %rax
    je user_mode_done
1:
    jmp exception_stubs + {invalid_opcode} * {stub_size}

    /* Drop the exception frame (on TSS.RSP0, below the saved registers) and return from
       enter_user_mode. iretq to ring 3 cleared DS and ES; user code may have left DF set and
       RFLAGS has IOPL 3: restore the kernel's view of all three. */
user_mode_done:
    mov {kernel_rsp}(%rip), %rsp
    push $0x2
    popfq
    mov ${kernel_data}, %eax
    mov %eax, %ds
    mov %eax, %es
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbp
    pop %rbx
    ret

    /* #GP: from ring 3 at an `out %eax, (%dx)` (0xef) to the permitted port, do the write for
       it and resume after the instruction; anything else goes to the usual report. The frame:
       error code, RIP, CS, RFLAGS, RSP, SS. */
    .global user_general_protection_stub
user_general_protection_stub:
    testb $3, 16(%rsp)
    jz 1f
    push %rax
    mov 16(%rsp), %rax
    cmpb $0xef, (%rax)
    pop %rax
    jne 1f
    cmpw {permitted_port}(%rip), %dx
    jne 1f
    out %eax, %dx
    add $8, %rsp
    incq (%rsp)
    iretq
1:
    jmp exception_stubs + {general_protection} * {stub_size}

    /* Reached from ring 3 by leave_user_mode; on a user-accessible page. */
    .section .text.user, "ax"
    .global user_mode_exit
user_mode_exit:
    ud2
"#,
    kernel_rsp = sym KERNEL_RSP_IN_USER_MODE,
    user_data = const USER_DATA_SELECTOR,
    user_code = const USER_CODE_SELECTOR,
    user_rflags = const USER_RFLAGS,
    kernel_data = const KERNEL_DATA_SELECTOR,
    permitted_port = sym PORT_WRITABLE_FROM_USER,
    invalid_opcode = const INVALID_OPCODE_VECTOR,
    general_protection = const GENERAL_PROTECTION_VECTOR,
    stub_size = const super::EXCEPTION_STUB_SIZE,
    options(att_syntax)
);
