//! Kernel entry and exit: exception stubs, the SYSCALL entries, the first entry to user mode
//! and the fault-tolerant user copy. Exceptions build one `TrapFrame` and call
//! `crate::trap::handle`; system calls take a shorter path that saves only the registers the
//! Rust code may clobber and calls `crate::syscall::dispatch` with the arguments in registers.
//! Both return with IRETQ.
//!
//! Why the short path: on PVM every kernel memory access is emulated (a push or pop costs
//! about 3 us), so the 30 pushes and pops of a full frame alone cost more than the exception
//! that delivers the call (about 20 us).

use super::cpu::{self, MSR_LSTAR, MSR_SFMASK};
use super::tables::{USER_CODE, USER_DATA};
use core::arch::global_asm;

pub use super::fastcall::RING3_SYSCALL_PAGE;

/// Points this CPU's LSTAR at its entry in `RING3_SYSCALL_PAGE` (`arch::fastcall`; the
/// caller has mapped the pages), and has SYSCALL leave interrupts enabled: it never enters
/// ring 0 here, where a clear IF would have protected the entry's stack switch.
pub fn redirect_syscall_to_ring3_page() {
    cpu::write_msr(MSR_LSTAR, super::fastcall::lstar_for(super::tables::current_cpu()));
    cpu::write_msr(MSR_SFMASK, super::tables::SYSCALL_FLAGS_MASK & !super::tables::INTERRUPT_FLAG);
}

/// Registers as the entry code saves them (lowest address first).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct TrapFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rbp: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    /// The exception vector, or `SYSCALL_VECTOR` for the SYSCALL instruction.
    pub vector: u64,
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

/// Not a hardware vector: marks full frames built for system calls that need them.
pub const SYSCALL_VECTOR: u64 = 256;
/// Not a hardware vector: a system call's short path found a signal to deliver and rebuilt
/// the caller's full frame (RAX holds the call's result) so that a handler frame can be built.
pub const SIGNAL_CHECK_VECTOR: u64 = 257;
/// The calls below 64 that need every register of the caller, as a bit mask: `rt_sigreturn`
/// (15) and `execve` (59) replace them, `clone`, `fork` and `vfork` (56-58) copy them.
const FULL_FRAME_CALLS_BELOW_64: u64 = 1 << 15 | 1 << 56 | 1 << 57 | 1 << 58 | 1 << 59;
/// `sigaltstack` reads the caller's stack pointer (is it on its alternate stack?).
const SIGALTSTACK_NUMBER: u64 = 131;

/// Says whether some thread may have a signal to take: the system-call path then leaves
/// through the full trap path (`SIGNAL_CHECK_VECTOR`), which delivers it. One compare on the
/// way out of every call; set and cleared by `crate::signal`. The word is
/// `fastcall::DATA.signal_check`, which the ring-3 fast calls read too.
pub fn request_signal_check(requested: bool) {
    super::fastcall::DATA.signal_check.store(requested as u32, core::sync::atomic::Ordering::Release);
}

pub fn signal_check_requested() -> bool {
    super::fastcall::DATA.signal_check.load(core::sync::atomic::Ordering::Acquire) != 0
}

/// The RFLAGS bits user code may set: CF, PF, AF, ZF, SF, TF, DF, OF, AC, ID.
pub const USER_FLAGS: u64 = 0x24_0dd5;
pub const EXCEPTION_STUB_SIZE: u64 = 16;

impl TrapFrame {
    pub fn is_from_user(&self) -> bool {
        self.cs & 3 == 3
    }

    /// A fresh user context starting at `entry` with stack `stack`, interrupts enabled.
    pub fn new_user(entry: u64, stack: u64) -> TrapFrame {
        TrapFrame { rip: entry, cs: USER_CODE as u64, rflags: 0x202, rsp: stack, ss: USER_DATA as u64, ..Default::default() }
    }

    /// On this host SYSCALL may leave the CPU in ring 3 (shared/notes/pvm.md): it then jumps
    /// to LSTAR and faults there from user mode. The first time, LSTAR is the supervisor-only
    /// kernel entry and the fault is a page fault; after `redirect_syscall_to_ring3_page` it
    /// is the `ud2` of that page, which the entry code sends straight to the system-call path.
    /// The user's return address is in RCX and its flags in R11.
    pub fn is_syscall_left_in_ring3(&self) -> bool {
        self.is_from_user() && self.vector == 14 && self.rip == syscall_entry_address()
    }

    /// Makes the frame return where a SYSCALL instruction returns: to RCX with the flags in R11
    /// (IF forced on, privileged flags off, as SYSRET would).
    pub fn return_as_syscall(&mut self) {
        self.rip = self.rcx;
        self.rflags = (self.r11 & USER_FLAGS) | 0x202;
    }
}

global_asm!(
    r#"
    .text
    .global exception_stubs, syscall_entry, run_ring3_stub, ring3_stub_failed, switch_kernel_stacks, trap_return, enter_user_frame, user_copy, user_copy_access, user_copy_access_end, user_copy_failed
    /* The registers a C caller keeps (SysV callee-saved): run_ring3_stub and
       switch_kernel_stacks keep them across their stack switches. */
    .macro push_callee_saved
    push %rbp
    push %rbx
    push %r12
    push %r13
    push %r14
    push %r15
    .endm
    .macro pop_callee_saved
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbx
    pop %rbp
    .endm

    .balign 16
exception_stubs:
    .irp vector, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .balign 16
    .if \vector == 6
    jmp invalid_opcode
    .endif
    .if \vector == 8 || \vector == 10 || \vector == 11 || \vector == 12 || \vector == 13 || \vector == 14 || \vector == 17 || \vector == 21 || \vector == 29 || \vector == 30
    .else
    pushq $0                           /* no error code from the CPU: keep the frame uniform */
    .endif
    pushq $\vector
    jmp trap_common
    .endr

    /* The scheduler's tick (an interrupt): the same frame as an exception. */
    .global tick_interrupt
tick_interrupt:
    pushq $0
    pushq ${tick_vector}
    jmp trap_common

    /* GS always holds the user's base in the kernel (nothing here uses GS), so exceptions
       need no SWAPGS; only the ring-0 SYSCALL entry borrows the kernel's for its stack. */
trap_common:
    push %rax
    push %rbx
    push %rcx
    push %rdx
    push %rsi
    push %rdi
    push %rbp
    push %r8
    push %r9
    push %r10
    push %r11
    push %r12
    push %r13
    push %r14
    push %r15
    cld
    mov %rsp, %rdi
    call lwk_trap_entry
trap_return:
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %r11
    pop %r10
    pop %r9
    pop %r8
    pop %rbp
    pop %rdi
    pop %rsi
    pop %rdx
    pop %rcx
    pop %rbx
    pop %rax
    add $16, %rsp                      /* vector and error code */
    iretq

    /* Invalid opcode: the ud2 of the ring-3 system-call page is a system call (the CPU
       pushed RIP, CS, RFLAGS, RSP, SS; RCX and R11 hold the user's RIP and RFLAGS).
       RIP is compared half by half to keep every register intact for a real #UD. */
invalid_opcode:
    cmpl ${page_low}, (%rsp)
    jne 1f
    cmpl ${page_high}, 4(%rsp)
    jne 1f
    mov %rcx, (%rsp)                   /* return after the SYSCALL instruction */
    and ${user_flags}, %r11
    or $0x202, %r11
    mov %r11, 16(%rsp)                 /* with its flags (IF on), as SYSRET would */
    jmp syscall_common
    /* The ud2 ending a ring-3 stub (`fpu`): in the stub page, with interrupts off, which
       only the kernel can arrange in ring 3 (a job that jumps there has IF set). */
1:  cmpl ${stub_high}, 4(%rsp)
    jne 2f
    cmpl ${stub_low}, (%rsp)
    jb 2f
    testl $0x200, 16(%rsp)
    jnz 2f
    cmpl ${stub_end_low}, (%rsp)
    jb ring3_stub_done
2:  pushq $0
    pushq $6
    jmp trap_common

    /* run_ring3_stub(rip, rsp0 field, rdi, edx:eax mask, esi) -> 0, or 1 if the stub
       trapped and the kernel gave it up (`ring3_stub_failed`): runs an XSAVE stub in ring 3
       with interrupts off, RSP0 pointing just below this call's saved registers (16-byte
       aligned, so that the trap frame of the stub's ud2 or fault sits right there). */
run_ring3_stub:
    push_callee_saved
    sub $8, %rsp
    mov %rsp, (%rsi)
    pushq ${user_data}
    pushq $0                           /* the stubs use no stack */
    pushq $2                           /* RFLAGS: interrupts off */
    pushq ${user_code}
    push %rdi
    mov %rdx, %rdi
    mov %r8, %rsi
    mov %ecx, %eax
    shr $32, %rcx
    mov %ecx, %edx
    iretq
ring3_stub_done:                       /* the CPU's five words of the ud2 trap on top */
    add $40, %rsp
    xor %eax, %eax
    jmp ring3_stub_return
    /* ring3_stub_failed(end of the stub's trap frame): back to run_ring3_stub's caller. */
ring3_stub_failed:
    mov %rdi, %rsp
    mov $1, %eax
ring3_stub_return:
    add $8, %rsp
    pop_callee_saved
    ret

    /* SYSCALL when it arrives in ring 0 (hardware, QEMU): user RSP is still live, so switch
       to the per-CPU trap stack and build the frame an exception from user mode would. */
    .balign 16
syscall_entry:
    swapgs
    mov %rsp, %gs:16
    mov %gs:8, %rsp
    pushq ${user_data}
    pushq %gs:16
    push %r11
    pushq ${user_code}
    push %rcx
    swapgs                             /* back to the user's GS */

    /* Above an IRETQ frame to user mode: save what a C call may clobber and the user must
       keep (RCX and R11 are the SYSCALL return RIP and RFLAGS, restored from the frame).
       The calls that need every user register (clone copies them, rt_sigreturn replaces
       them, sigaltstack reads RSP) take the exception path with a full frame instead, and
       so does the way out when a signal may be due (the signal-check word). */
syscall_common:
    cmp $63, %rax
    ja 4f
    mov ${full_frame_calls}, %r11
    bt %rax, %r11
    jc 5f
    jmp 3f
4:  cmp ${sigaltstack}, %rax
    jne 3f
5:  mov 16(%rsp), %r11                 /* the user's flags again, as SYSCALL left them */
    pushq $0
    pushq ${syscall_vector}
    jmp trap_common
3:  push %rdi
    push %rsi
    push %rdx
    push %r8
    push %r9
    push %r10
    cld
    mov %r10, %rcx                     /* fourth argument */
    push %rax                          /* the number, seventh C argument; keeps RSP aligned */
    call lwk_syscall
    add $8, %rsp
    pop %r10
    pop %r9
    pop %r8
    pop %rdx
    pop %rsi
    pop %rdi
    mov (%rsp), %rcx
    mov 16(%rsp), %r11
    cmpl $0, {fast_data}+{signal_check}(%rip)
    jne 6f
    iretq
6:  pushq $0                           /* a signal may be due: take the full trap path */
    pushq ${signal_check_vector}
    jmp trap_common

    /* enter_user_frame(frame in RDI): the frame already sits at the top of the trap stack. */
enter_user_frame:
    mov %rdi, %rsp
    jmp trap_return

    /* switch_kernel_stacks(save RSP to [RDI], load RSP from RSI): callee-saved registers go
       on the old stack, come back from the new one; a new thread's stack is prepared so that
       this `ret` lands on trap_return with its user frame above. */
switch_kernel_stacks:
    push_callee_saved
    mov %rsp, (%rdi)
    mov %rsi, %rsp
    pop_callee_saved
    ret

    /* user_copy(dst, src, len) -> 0, or 1 if a user page faulted: the page-fault handler
       moves a RIP in [user_copy_access, user_copy_access_end) to user_copy_failed.
       Words, then the last bytes: on PVM every kernel instruction is emulated and a string
       instruction costs per element (measured: `rep movsb` about 0.9 us per byte, `rep
       movsq` about the same per 8 bytes, a loop of moves more: each load or store is
       emulated with its own page walk). */
user_copy:
    mov %rdx, %rcx
    shr $3, %rcx
user_copy_access:
    rep movsq
    mov %rdx, %rcx
    and $7, %rcx
    rep movsb
user_copy_access_end:
    xor %eax, %eax
    ret
user_copy_failed:
    mov $1, %eax
    ret
"#,
    user_data = const USER_DATA as u64,
    user_code = const USER_CODE as u64,
    page_low = const RING3_SYSCALL_PAGE as u32,
    page_high = const (RING3_SYSCALL_PAGE >> 32) as u32,
    user_flags = const USER_FLAGS,
    stub_high = const (super::fpu::STUB_PAGE >> 32) as u32,
    stub_low = const super::fpu::STUB_PAGE as u32,
    stub_end_low = const (super::fpu::STUB_PAGE + super::paging::PAGE_SIZE) as u32,
    full_frame_calls = const FULL_FRAME_CALLS_BELOW_64,
    sigaltstack = const SIGALTSTACK_NUMBER,
    signal_check_vector = const SIGNAL_CHECK_VECTOR,
    tick_vector = const super::apic::TICK_VECTOR,
    syscall_vector = const SYSCALL_VECTOR,
    fast_data = sym super::fastcall::DATA,
    signal_check = const core::mem::offset_of!(super::fastcall::FastData, signal_check),
    options(att_syntax)
);

extern "C" {
    static exception_stubs: u8;
    static syscall_entry: u8;
    static tick_interrupt: u8;
    static user_copy_access: u8;
    static user_copy_access_end: u8;
    static user_copy_failed: u8;
    fn enter_user_frame(frame: *const TrapFrame) -> !;
    fn switch_kernel_stacks(save_rsp_to: *mut u64, load_rsp: u64);
    static trap_return: u8;
    fn user_copy(dst: u64, src: u64, len: u64) -> u64;
    /// See the assembly: `rsp0_field` is this CPU's TSS.RSP0 (restored by the caller).
    pub fn run_ring3_stub(rip: u64, rsp0_field: *mut u64, rdi: u64, mask: u64, rsi: u64) -> u64;
    /// Unwinds to `run_ring3_stub`'s caller, which gets 1; `frame_end` is the end of the
    /// stub's trap frame.
    pub fn ring3_stub_failed(frame_end: u64) -> !;
}

pub fn exception_stubs_start() -> u64 {
    &raw const exception_stubs as u64
}

pub fn tick_handler() -> u64 {
    &raw const tick_interrupt as u64
}

pub fn syscall_entry_address() -> u64 {
    &raw const syscall_entry as u64
}

/// Kernel contexts: each job thread, and each CPU's idle loop, has a kernel stack; a context
/// that is not running keeps its kernel RSP in its slot here (its other kernel registers are
/// on that stack). Slots below `MAX_THREADS` are threads', then come the CPUs' idle loops,
/// then one slot per CPU where exiting threads leave their last (never resumed) context.
/// A slot reads 0 while its context is being saved: see `mark_leaving`.
pub const MAX_THREADS: usize = 256;
const CONTEXT_SLOTS: usize = MAX_THREADS + 2 * super::tables::MAX_CPUS;
static SAVED_RSP: [core::sync::atomic::AtomicU64; CONTEXT_SLOTS] = [const { core::sync::atomic::AtomicU64::new(0) }; CONTEXT_SLOTS];

/// The context slot of `cpu`'s idle loop.
pub fn idle_slot(cpu: usize) -> usize {
    MAX_THREADS + cpu
}

/// Where a thread exiting on `cpu` saves a context nobody resumes (its own slot may already
/// belong to a new thread).
pub fn exit_slot(cpu: usize) -> usize {
    MAX_THREADS + super::tables::MAX_CPUS + cpu
}

/// Called, under the scheduler lock, before a context that another CPU may resume (a thread
/// moving to another CPU) is switched away from: until the switch has saved it, the slot
/// reads 0 and `switch_context` waits.
pub fn mark_leaving(slot: usize) {
    SAVED_RSP[slot].store(0, core::sync::atomic::Ordering::Release);
}
pub const KERNEL_STACK_SIZE: u64 = 32 * 1024;

/// Prepares the kernel stack ending at `stack_top` (a fresh allocation of
/// `KERNEL_STACK_SIZE`) so that the first switch to `slot` starts `frame` in user mode.
pub fn prepare_thread(slot: usize, stack_top: u64, frame: &TrapFrame) {
    let frame_address = stack_top - core::mem::size_of::<TrapFrame>() as u64;
    // Below the frame: `switch_kernel_stacks`' return address, then its six saved registers.
    let return_slot = frame_address - 8;
    let saved_rsp = return_slot - 6 * 8;
    // SAFETY: the stack is fresh memory of KERNEL_STACK_SIZE bytes that only this thread will
    // use; the writes stay in its top few hundred bytes.
    unsafe {
        (frame_address as *mut TrapFrame).write(*frame);
        (return_slot as *mut u64).write(&raw const trap_return as u64);
        core::ptr::write_bytes(saved_rsp as *mut u64, 0, 6);
    }
    SAVED_RSP[slot].store(saved_rsp, core::sync::atomic::Ordering::Relaxed);
}

/// The user RIP and RSP of the last entry from user mode of the thread whose live kernel stack
/// ends at `stack_top` (the entry's frame tops that stack), for `sched::log_job_threads`.
pub fn user_context(stack_top: u64) -> (u64, u64) {
    let frame = (stack_top - core::mem::size_of::<TrapFrame>() as u64) as *const TrapFrame;
    // SAFETY: the caller names a live kernel stack, whose top words are a frame; a read of
    // two words of it, which may be stale but are always mapped.
    unsafe { ((*frame).rip, (*frame).rsp) }
}

/// Prepares a kernel-only context (a CPU's idle loop) on the stack ending at `stack_top`:
/// the first switch to `slot` calls `entry`.
pub fn prepare_kernel_context(slot: usize, stack_top: u64, entry: extern "C" fn() -> !) {
    // Below a zero word (keeping `entry`'s stack aligned as after a call): the return address
    // `switch_kernel_stacks` takes, then its six saved registers.
    let return_slot = stack_top - 16;
    let saved_rsp = return_slot - 6 * 8;
    // SAFETY: the stack is memory reserved for this context; the writes stay in its top 64
    // bytes.
    unsafe {
        ((stack_top - 8) as *mut u64).write(0);
        (return_slot as *mut u64).write(entry as usize as u64);
        core::ptr::write_bytes(saved_rsp as *mut u64, 0, 6);
    }
    SAVED_RSP[slot].store(saved_rsp, core::sync::atomic::Ordering::Relaxed);
}

/// Waits until context `to` is saved completely (vector registers included: its CPU saved
/// them before it switched away) when it just left another CPU; returns its kernel RSP.
pub fn wait_until_saved(to: usize) -> u64 {
    loop {
        match SAVED_RSP[to].load(core::sync::atomic::Ordering::Acquire) {
            0 => core::hint::spin_loop(),
            rsp => break rsp,
        }
    }
}

/// Suspends the running context (slot `from`) of this CPU and resumes slot `to`, whose kernel
/// stack ends at `to_stack_top` (0 for an idle loop, which takes no user traps). Returns when
/// something switches back to `from`.
pub fn switch_context(cpu: usize, from: usize, to: usize, to_stack_top: u64) {
    if to_stack_top != 0 {
        super::tables::set_kernel_stack(cpu, to_stack_top);
    }
    let to_rsp = wait_until_saved(to);
    // SAFETY: `to` was saved by an earlier switch (completely: see `mark_leaving`) or
    // prepared by `prepare_thread`, so its RSP points at callee-saved registers and a return
    // address; interrupts are off.
    unsafe { switch_kernel_stacks(SAVED_RSP[from].as_ptr(), to_rsp) }
}

#[no_mangle]
extern "C" fn lwk_trap_entry(frame: &mut TrapFrame) {
    // An exception the ring-3 fast-call code raised is the kernel path's to answer: the frame
    // now stands at its ud2.
    if super::fastcall::abort_interrupted(frame) {
        return;
    }
    crate::trap::handle(frame);
}

#[no_mangle]
extern "C" fn lwk_syscall(arg0: u64, arg1: u64, arg2: u64, arg3: u64, arg4: u64, arg5: u64, number: u64) -> u64 {
    let result = crate::syscall::dispatch(number, &mut crate::syscall::Call { args: [arg0, arg1, arg2, arg3, arg4, arg5], frame: None });
    crate::sched::retake_missed_tick();
    result
}

/// Leaves the kernel for good on this stack: starts `frame` in user mode.
pub fn enter_user(frame: &TrapFrame) -> ! {
    let top = super::tables::trap_stack_top();
    // The main thread's traps land on its own stack: this CPU's last thread of a previous job
    // may have left a stack the job's end freed (and the new job's memory reuses) as RSP0.
    super::tables::set_kernel_stack(super::tables::current_cpu(), top);
    let slot = (top - core::mem::size_of::<TrapFrame>() as u64) as *mut TrapFrame;
    // SAFETY: the top of the trap stack is free (we are on the boot or the service stack), and
    // the frame is a user context (CS/SS user selectors set by `TrapFrame::new_user`).
    unsafe {
        slot.write(*frame);
        enter_user_frame(slot)
    }
}

/// If `frame` is a page fault inside `user_copy`, makes the copy return failure.
pub fn recover_user_copy_fault(frame: &mut TrapFrame) -> bool {
    let access = (&raw const user_copy_access as u64)..(&raw const user_copy_access_end as u64);
    let failed = &raw const user_copy_failed as u64;
    if frame.vector == 14 && access.contains(&frame.rip) {
        frame.rip = failed;
        true
    } else {
        false
    }
}

/// The lowest address that is not user space.
pub const USER_END: u64 = 0x0000_8000_0000_0000;

#[derive(Debug)]
pub struct UserFault;

fn check_user_range(address: u64, len: usize) -> Result<(), UserFault> {
    match address.checked_add(len as u64) {
        Some(end) if end <= USER_END => Ok(()),
        _ => Err(UserFault),
    }
}

/// Copies from user memory; a bad pointer yields `UserFault` instead of a kernel fault.
pub fn copy_from_user(destination: &mut [u8], user_source: u64) -> Result<(), UserFault> {
    check_user_range(user_source, destination.len())?;
    // SAFETY: the source range is user space (checked above) and faults are recovered; the
    // destination is a kernel slice of the same length.
    match unsafe { user_copy(destination.as_mut_ptr() as u64, user_source, destination.len() as u64) } {
        0 => Ok(()),
        _ => Err(UserFault),
    }
}

/// Copies 64-bit words into user memory (little-endian, as x86 stores them), without
/// converting them byte by byte first.
pub fn copy_words_to_user(user_destination: u64, words: &[u64]) -> Result<(), UserFault> {
    // SAFETY: a `u64` slice is readable as bytes of eight times its length.
    let bytes = unsafe { core::slice::from_raw_parts(words.as_ptr().cast::<u8>(), core::mem::size_of_val(words)) };
    copy_to_user(user_destination, bytes)
}

/// Copies into user memory; write-protected or unmapped pages yield `UserFault`.
pub fn copy_to_user(user_destination: u64, source: &[u8]) -> Result<(), UserFault> {
    check_user_range(user_destination, source.len())?;
    // SAFETY: as `copy_from_user`, the other way round (CR0.WP makes read-only pages fault).
    match unsafe { user_copy(user_destination, source.as_ptr() as u64, source.len() as u64) } {
        0 => Ok(()),
        _ => Err(UserFault),
    }
}
