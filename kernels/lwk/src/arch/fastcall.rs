//! Fast calls: system calls that need no privilege, answered in ring 3 at LSTAR.
//!
//! On the PVM host a user-mode SYSCALL lands at LSTAR still in ring 3 (shared/notes/pvm.md),
//! and only the kernel's entries are emulated; so once the first system call has shown that
//! (`crate::trap`), each CPU's LSTAR points at its own entry in the user-executable
//! `RING3_SYSCALL_PAGE`, whose code answers getpid, gettid, getppid, the uid/gid calls,
//! uname, getrusage (self, thread), times, clock_gettime and clock_getres (ids 0-11),
//! getcpu and sched_yield (with nothing queued) natively, from `DATA`, and sends every other
//! call to the kernel path: the `ud2` at the page's first byte, which the #UD entry turns
//! into a system call (`arch::trap`). On VMX/SVM and QEMU, SYSCALL enters ring 0 and LSTAR
//! stays the kernel's entry: none of this runs.
//!
//! Three pages at the top of every address space (the code's RIP-relative addresses need
//! them at these fixed distances):
//!
//! | address | what | user rights |
//! |---|---|---|
//! | `DATA_PAGE` | `DATA`: a page of the kernel image, one for all processes | read |
//! | `SCRATCH_PAGE` | a page per process: per CPU, the caller's registers and RSP | read, write |
//! | `RING3_SYSCALL_PAGE` | the `ud2`, one entry per CPU, the code | read, execute |
//!
//! Per CPU: the entry saves RSP in its CPU's scratch slot and points RSP at that slot, so the
//! shared code finds the CPU's slot (and its data slot, one page below) from RSP and never
//! touches the user's stack. It saves the registers it uses there, answers with ordinary
//! loads and stores, restores them, loads RFLAGS from R11 as the kernel path would (POPFQ
//! from the slot) and jumps to RCX.
//!
//! Why it is always right: any entry to the kernel from this code (an interrupt, a fault on a
//! bad user pointer) goes through `abort_interrupted`, which puts the caller's registers back
//! from the slot first. After a fault the call continues on the kernel path (which gives the
//! user EFAULT, exactly); after an interrupt the SYSCALL instruction is executed again. So
//! the code never runs across a context switch or a move to another CPU (nothing it read can
//! change under it, and no other thread of the process can reuse the CPU's slot meanwhile),
//! and a signal that became due is seen: the code sends the call to the kernel whenever
//! `DATA.signal_check` is set, as the kernel path's way out does. A pointer into the three
//! pages themselves is left to the kernel too (the code checks the end of every range it
//! writes against `DATA_PAGE`; kernel addresses fail the same check).

use super::paging::PAGE_SIZE;
use super::tables::MAX_CPUS;
use super::trap::{TrapFrame, USER_FLAGS};
use core::arch::global_asm;
use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use enclave_proto::slots::{
    RING3_ARGS, RING3_CALL, RING3_ESCALATE, RING3_HOST_AWAKE, RING3_PATH, RING3_PATH_CAPACITY, RING3_REQUEST_PAGE, RING3_RESULT,
    RING3_SLOT_SIZE, RING3_STATE,
};

/// Where SYSCALL goes once it is known to stay in ring 3: the code page. Its first byte is
/// the `ud2` of the kernel path (an invalid-opcode exception reaches the kernel several times
/// faster on PVM than the page fault a supervisor-only LSTAR raises).
pub const RING3_SYSCALL_PAGE: u64 = 0x0000_7fff_ffff_f000;
/// Each process's own page of saved registers (per CPU, `SLOT_SIZE` bytes).
pub const SCRATCH_PAGE: u64 = RING3_SYSCALL_PAGE - PAGE_SIZE;
/// The part of the scratch page no CPU uses: the kernel has uname write its record there once,
/// to publish it (`crate::trap`).
pub const SCRATCH_SPARE: u64 = SCRATCH_PAGE + MAX_CPUS as u64 * SLOT_SIZE;
/// `DATA`, read-only: the lowest address of the three pages.
pub const DATA_PAGE: u64 = RING3_SYSCALL_PAGE - 2 * PAGE_SIZE;

/// One CPU's part of the scratch page and of `DATA.cpus`.
const SLOT_SIZE: u64 = 128;
/// The entries, one per CPU, `ENTRY_SIZE` bytes apart.
const ENTRY_SIZE: u64 = 32;

/// Where the caller's registers are kept in a CPU's scratch slot (byte offsets).
mod slot {
    pub const RAX: usize = 0;
    pub const RCX: usize = 8;
    pub const R11: usize = 16;
    pub const RDX: usize = 24;
    pub const RSI: usize = 32;
    pub const RDI: usize = 40;
    pub const RSP: usize = 48;
    /// The flags POPFQ loads on the way out.
    pub const FLAGS: usize = 56;
    pub const WORDS: usize = 8;
}

/// What the kernel publishes about the thread a CPU runs.
#[repr(C, align(128))]
pub struct CpuData {
    pub tid: AtomicU64,
    pub pid: AtomicU64,
    pub ppid: AtomicU64,
    /// This CPU's index (getcpu).
    pub cpu: AtomicU64,
    /// The running thread's CPU time minus the clock (`sched`): their sum is its CPU time.
    pub thread_clock: AtomicU64,
    /// Non-zero while the host knows this CPU's process (`enclave::slots::ring3_publish`): its
    /// file calls may be posted from ring 3.
    pub files_ready: AtomicU64,
}

/// How long the ring-3 code waits for the host to take a posted file call before it takes the
/// call back for the kernel path (which rings the host's doorbell and costs milliseconds on
/// PVM): briefly while the host's pump sleeps on the doorbell, longer while it polls (its
/// slot's `RING3_HOST_AWAKE` word), covering the pump's naps on a loaded host. The core is the
/// job's own, so waiting costs nobody else.
const FILE_WAIT_ASLEEP_NS: u64 = 50_000;
const FILE_WAIT_AWAKE_NS: u64 = 10_000_000;

/// `struct utsname`: six 65-byte fields, in whole words.
pub const UTSNAME_SIZE: usize = 6 * 65;
const UTSNAME_WORDS: usize = UTSNAME_SIZE.div_ceil(8);

/// The page the ring-3 code reads; the kernel keeps it current. Some words are the kernel's
/// own state, kept here rather than copied: the run-queue lengths (`sched`), the signal-check
/// flag (`arch::trap`) and the job's start (`job`).
#[repr(C, align(4096))]
pub struct FastData {
    pub cpus: [CpuData; MAX_CPUS],
    /// Non-zero when some thread may have a signal to take or must end: the kernel path's
    /// way out then takes the full trap path, and the ring-3 code sends calls to it.
    pub signal_check: AtomicU32,
    /// Each CPU's run-queue length.
    pub queued: [AtomicUsize; MAX_CPUS],
    /// When the job started (`clock::monotonic_ns`): the zero of its CPU time.
    pub job_start_ns: AtomicU64,
    /// Non-zero while the job has files of its own in memory (`fs`) that the host could not be
    /// told about: paths are then all the kernel's to resolve.
    pub job_files: AtomicU32,
    /// `clock::TscScale`: monotonic ns = ((TSC - boot_tsc) * multiplier) >> shift.
    boot_tsc: AtomicU64,
    tsc_multiplier: AtomicU64,
    tsc_shift: AtomicU64,
    boot_realtime_ns: AtomicU64,
    /// `FILE_WAIT_ASLEEP_NS` and `FILE_WAIT_AWAKE_NS` in TSC ticks.
    file_wait_ticks: [AtomicU64; 2],
    utsname: [AtomicU64; UTSNAME_WORDS],
}

const _: () = assert!(core::mem::size_of::<FastData>() == PAGE_SIZE as usize && core::mem::size_of::<CpuData>() == SLOT_SIZE as usize);
const _: () = assert!(MAX_CPUS as u64 * SLOT_SIZE + UTSNAME_SIZE as u64 <= PAGE_SIZE);
const _: () = assert!(MAX_CPUS as u64 * RING3_SLOT_SIZE <= PAGE_SIZE && RING3_SLOT_SIZE.is_power_of_two());

pub static DATA: FastData = FastData {
    cpus: [const {
        CpuData {
            tid: AtomicU64::new(0),
            pid: AtomicU64::new(0),
            ppid: AtomicU64::new(0),
            cpu: AtomicU64::new(0),
            thread_clock: AtomicU64::new(0),
            files_ready: AtomicU64::new(0),
        }
    }; MAX_CPUS],
    signal_check: AtomicU32::new(0),
    queued: [const { AtomicUsize::new(0) }; MAX_CPUS],
    job_start_ns: AtomicU64::new(0),
    job_files: AtomicU32::new(0),
    boot_tsc: AtomicU64::new(0),
    tsc_multiplier: AtomicU64::new(0),
    tsc_shift: AtomicU64::new(0),
    boot_realtime_ns: AtomicU64::new(0),
    file_wait_ticks: [const { AtomicU64::new(0) }; 2],
    utsname: [const { AtomicU64::new(0) }; UTSNAME_WORDS],
};

/// Fills what never changes while the kernel runs: the CPU indexes, the clock's scale (the
/// same numbers `clock::monotonic_ns` uses) and uname's answer.
pub fn publish_constants(boot_tsc: u64, multiplier: u64, shift: u32, boot_realtime_ns: u64, utsname: &[u8; UTSNAME_SIZE]) {
    // The layout the entries and the mapping rely on (the assembler cannot check it: its
    // jumps are sized late).
    let page = &raw const ring3_syscall_page as u64;
    assert!(&raw const fast_end as u64 - page <= PAGE_SIZE, "the fast-call code outgrew its page");
    assert!(
        &raw const fast_entries_end as u64 - &raw const fast_entries as u64 == MAX_CPUS as u64 * ENTRY_SIZE,
        "one fast-call entry per CPU"
    );
    for (index, cpu) in DATA.cpus.iter().enumerate() {
        cpu.cpu.store(index as u64, Ordering::Relaxed);
    }
    DATA.boot_tsc.store(boot_tsc, Ordering::Relaxed);
    DATA.tsc_multiplier.store(multiplier, Ordering::Relaxed);
    DATA.tsc_shift.store(shift as u64, Ordering::Relaxed);
    DATA.boot_realtime_ns.store(boot_realtime_ns, Ordering::Relaxed);
    for (ticks, ns) in DATA.file_wait_ticks.iter().zip([FILE_WAIT_ASLEEP_NS, FILE_WAIT_AWAKE_NS]) {
        ticks.store((((ns as u128) << shift) / multiplier.max(1) as u128) as u64, Ordering::Relaxed);
    }
    for (word, bytes) in DATA.utsname.iter().zip(utsname.chunks(8)) {
        let mut padded = [0u8; 8];
        padded[..bytes.len()].copy_from_slice(bytes);
        word.store(u64::from_le_bytes(padded), Ordering::Relaxed);
    }
}

/// A new job: its first thread (`pid`, the process's main thread, parent outside the enclave)
/// runs on CPU 0; other CPUs run nothing of it yet (pids start again with each job).
pub fn job_started(pid: u64) {
    for cpu in &DATA.cpus {
        cpu.pid.store(0, Ordering::Relaxed);
    }
    process_entered(0, pid, 0);
    thread_entered(0, pid);
}

/// CPU `cpu` now runs thread `tid`.
pub fn thread_entered(cpu: usize, tid: u64) {
    DATA.cpus[cpu].tid.store(tid, Ordering::Relaxed);
}

/// The thread `cpu` runs has CPU time `offset` + the monotonic clock.
pub fn thread_clock_changed(cpu: usize, offset: u64) {
    DATA.cpus[cpu].thread_clock.store(offset, Ordering::Relaxed);
}

/// Whether what `cpu` publishes is about process `pid` already.
pub fn runs_process(cpu: usize, pid: u64) -> bool {
    DATA.cpus[cpu].pid.load(Ordering::Relaxed) == pid
}

/// CPU `cpu` now runs process `pid`, whose parent is `ppid` (the caller holds the lock that
/// orders this with `parent_changed`).
pub fn process_entered(cpu: usize, pid: u64, ppid: u64) {
    DATA.cpus[cpu].ppid.store(ppid, Ordering::Relaxed);
    DATA.cpus[cpu].pid.store(pid, Ordering::Relaxed);
}

/// Process `pid` has a new parent, `ppid` (it was orphaned).
pub fn parent_changed(pid: u64, ppid: u64) {
    for cpu in DATA.cpus.iter().filter(|cpu| cpu.pid.load(Ordering::Relaxed) == pid) {
        cpu.ppid.store(ppid, Ordering::Relaxed);
    }
}

/// Whether the ring-3 code may post `cpu`'s file calls to the host (`enclave::slots`).
pub fn files_ready(cpu: usize, ready: bool) {
    DATA.cpus[cpu].files_ready.store(ready as u64, Ordering::SeqCst);
}

pub fn files_ready_on(cpu: usize) -> bool {
    DATA.cpus[cpu].files_ready.load(Ordering::Relaxed) != 0
}

/// Whether the job has files of its own in memory that the host does not know (`fs`).
pub fn set_job_files(present: bool) {
    DATA.job_files.store(present as u32, Ordering::Relaxed);
}

/// The physical pages to map at `DATA_PAGE` and `RING3_SYSCALL_PAGE`.
pub fn data_page_physical() -> u64 {
    &raw const DATA as u64 - super::phys::KERNEL_VMA
}

pub fn code_page_physical() -> u64 {
    &raw const ring3_syscall_page as u64 - super::phys::KERNEL_VMA
}

/// `lwk.fastcalls=off` turns fast calls off: every call takes the kernel path (to compare).
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// LSTAR for `cpu` once SYSCALL is known to stay in ring 3: its fast entry, or, with fast
/// calls off, the kernel path's `ud2`.
pub fn lstar_for(cpu: usize) -> u64 {
    match ENABLED.load(Ordering::Relaxed) {
        true => RING3_SYSCALL_PAGE + entries_offset() + cpu as u64 * ENTRY_SIZE,
        false => RING3_SYSCALL_PAGE,
    }
}

fn entries_offset() -> u64 {
    &raw const fast_entries as u64 - &raw const ring3_syscall_page as u64
}

/// If `frame` interrupted the ring-3 code (anything but its `ud2`, which the #UD entry
/// takes), puts the caller's registers back from this CPU's scratch slot. An exception the
/// code raised (a bad user pointer, single-stepping) is the kernel path's to answer: the
/// frame is left at the `ud2`, and the caller returns to it without handling the exception
/// (true). An interrupt is handled as usual, and the SYSCALL instruction runs again (false);
/// but an interrupt of a file call the host has taken while others wait for the CPU sends the
/// thread to `fast_file_collect`, whose `ud2` collects the answer (`collect_held_call`; false).
pub fn abort_interrupted(frame: &mut TrapFrame) -> bool {
    let offset = frame.rip.wrapping_sub(RING3_SYSCALL_PAGE);
    if !frame.is_from_user() || offset == 0 || offset >= PAGE_SIZE {
        return false;
    }
    if offset == &raw const fast_file_collect as u64 - &raw const ring3_syscall_page as u64 {
        // Its `ud2` (an interrupt that came first is handled as usual, the frame unchanged:
        // collecting may give the CPU up, which must wait for the interrupt's end).
        if frame.vector == INVALID_OPCODE {
            collect_held_call(frame);
            // Out as a system call leaves (a tick taken meanwhile, a signal, a kill).
            frame.vector = super::trap::SIGNAL_CHECK_VECTOR;
        }
        return false;
    }
    let entries = entries_offset()..entries_offset() + MAX_CPUS as u64 * ENTRY_SIZE;
    // At an entry's first instruction nothing has changed yet; after it RSP has; from
    // `fast_saved` on, the other registers may have too (each was saved before it changed).
    let at_entry = entries.contains(&offset) && (offset - entries.start).is_multiple_of(ENTRY_SIZE);
    if !at_entry {
        let mut words = [0u64; slot::WORDS];
        // SAFETY: a `u64` array is writable as bytes of eight times its length.
        let bytes = unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), core::mem::size_of_val(&words)) };
        // The slot is the process's own memory; if the job unmapped it, its registers stay
        // as they are (it broke its own calls).
        if super::trap::copy_from_user(bytes, SCRATCH_PAGE + super::tables::current_cpu() as u64 * SLOT_SIZE).is_ok() {
            let word = |offset: usize| words[offset / 8];
            frame.rsp = word(slot::RSP);
            if offset >= &raw const fast_saved as u64 - &raw const ring3_syscall_page as u64 {
                frame.rax = word(slot::RAX);
                frame.rcx = word(slot::RCX);
                frame.r11 = word(slot::R11);
                frame.rdx = word(slot::RDX);
                frame.rsi = word(slot::RSI);
                frame.rdi = word(slot::RDI);
            }
        }
    }
    let posted = &raw const fast_file_posted as u64 - &raw const ring3_syscall_page as u64
        ..&raw const fast_file_end as u64 - &raw const ring3_syscall_page as u64;
    if posted.contains(&offset) {
        // The host serves the call while others wait for this CPU (a tick at the end of the
        // slice): the thread comes back for the answer at `fast_file_collect` once the
        // interrupt is handled, from the kernel, where it may give the CPU up while it waits.
        if frame.vector >= 32 && crate::enclave::slots::ring3_hold() {
            frame.rax = super::tables::current_cpu() as u64;
            frame.rip = RING3_SYSCALL_PAGE + (&raw const fast_file_collect as u64 - &raw const ring3_syscall_page as u64);
            frame.rflags = (frame.r11 & USER_FLAGS) | 0x202;
            return false;
        }
        // A file call is in the host's hands: done once, whatever comes now.
        if let Some(result) = crate::enclave::slots::ring3_finish() {
            frame.rax = result as u64;
            frame.rip = frame.rcx;
            frame.rflags = (frame.r11 & USER_FLAGS) | 0x202;
            return frame.vector < 32;
        }
    }
    if frame.vector < 32 {
        frame.rip = RING3_SYSCALL_PAGE;
        true
    } else {
        // Back to the SYSCALL instruction (two bytes before its return address), with the
        // flags it was executed with, as Linux restarts a call.
        frame.rip = frame.rcx.wrapping_sub(2);
        frame.rflags = (frame.r11 & USER_FLAGS) | 0x202;
        false
    }
}

/// The exception `ud2` raises.
const INVALID_OPCODE: u64 = 6;

/// The `ud2` at `fast_file_collect`, with RAX the CPU whose ring-3 slot the thread holds
/// (`abort_interrupted`): its call returns with the answer, or goes to the kernel path if the
/// host sent it there. A job that jumps there itself gets the kernel path for RAX's call.
fn collect_held_call(frame: &mut TrapFrame) {
    use crate::enclave::slots::Collected;
    match crate::enclave::slots::ring3_collect(frame.rax) {
        Collected::Result(result) => {
            frame.rax = result as u64;
            frame.rip = frame.rcx;
            frame.rflags = (frame.r11 & USER_FLAGS) | 0x202;
        }
        Collected::Kernel(number) => {
            frame.rax = number;
            frame.rip = RING3_SYSCALL_PAGE;
        }
        Collected::NotHeld => frame.rip = RING3_SYSCALL_PAGE,
    }
}

global_asm!(
    r#"
    .section .text.ring3_syscall_page, "ax"
    .balign 4096
    .global ring3_syscall_page, fast_entries, fast_entries_end, fast_saved, fast_file_posted, fast_file_end, fast_file_collect
    .global fast_end
ring3_syscall_page:
    ud2                                /* the kernel path: #UD entry, RIP == this page */

    /* CPU n's entry: RSP to its scratch slot, the caller's RSP saved there. */
    .balign {entry_size}
fast_entries:
    .irp cpu, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
    .balign {entry_size}
    mov %rsp, ring3_syscall_page - {page} + \cpu * {slot_size} + {s_rsp}(%rip)
    lea ring3_syscall_page - {page} + \cpu * {slot_size}(%rip), %rsp
    jmp fast_common
    .endr
    .balign {entry_size}
fast_entries_end:

    /* DATA, RIP-relative: two pages below the code. Per CPU, from RSP (the scratch slot):
       one page below it. */
    .set FAST_DATA, ring3_syscall_page - 2 * {page}
    .set FAST_CPU_DATA, -{page}

    /* Escalates unless REG..REG+LEN lies below the fast-call pages (kernel addresses and the
       pages themselves go to the kernel, which judges them). Clobbers RCX. */
    .macro fast_user_range reg, len
    mov $({data_page} - \len), %rcx
    cmp %rcx, \reg
    ja fast_escalate
    .endm

    /* RAX = the monotonic clock in ns, as clock::monotonic_ns. Clobbers RCX, RDX. */
    .macro fast_monotonic
    lfence
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub FAST_DATA + {boot_tsc}(%rip), %rax
    mulq FAST_DATA + {multiplier}(%rip)
    mov FAST_DATA + {shift}(%rip), %ecx
    shrd %cl, %rdx, %rax
    .endm

    /* RAX = RAX / DIVISOR, RDX = the remainder. Clobbers RCX. */
    .macro fast_divide divisor
    xor %edx, %edx
    mov $\divisor, %ecx
    div %rcx
    .endm

    /* Back to the caller's registers as fast_common saved them (all but RAX and RSP). */
    .macro fast_restore
    mov {s_rcx}(%rsp), %rcx
    mov {s_r11}(%rsp), %r11
    mov {s_rdx}(%rsp), %rdx
    mov {s_rsi}(%rsp), %rsi
    mov {s_rdi}(%rsp), %rdi
    .endm

fast_common:
    mov %rax, {s_rax}(%rsp)
    mov %rcx, {s_rcx}(%rsp)
    mov %r11, {s_r11}(%rsp)
    mov %rdx, {s_rdx}(%rsp)
    mov %rsi, {s_rsi}(%rsp)
    mov %rdi, {s_rdi}(%rsp)
fast_saved:
    test $0x100, %r11d                 /* TF: the kernel path single-steps as Linux does */
    jnz fast_escalate
    cmpl $0, FAST_DATA + {signal_check}(%rip)
    jne fast_escalate                  /* a signal may be due: the kernel path delivers it */
    cmp $39, %rax
    je fast_getpid
    cmp $186, %rax
    je fast_gettid
    cmp $110, %rax
    je fast_getppid
    cmp $102, %rax                     /* getuid, getgid, geteuid, getegid: root */
    je fast_zero
    cmp $104, %rax
    je fast_zero
    cmp $107, %rax
    je fast_zero
    cmp $108, %rax
    je fast_zero
    cmp $118, %rax                     /* getresuid, getresgid: root */
    je fast_getres
    cmp $120, %rax
    je fast_getres
    cmp $228, %rax
    je fast_clock_gettime
    cmp $229, %rax
    je fast_clock_getres
    cmp $98, %rax
    je fast_getrusage
    cmp $100, %rax
    je fast_times
    cmp $309, %rax
    je fast_getcpu
    cmp $24, %rax
    je fast_sched_yield
    cmp $63, %rax
    je fast_uname
    cmp $0, %rax                       /* the file calls the host may serve (enclave::slots) */
    je fast_file
    cmp $1, %rax
    je fast_file
    cmp $17, %rax
    je fast_file
    cmp $18, %rax
    je fast_file
    cmp $8, %rax
    je fast_file
    cmp $5, %rax
    je fast_file
    cmp $4, %rax
    je fast_file
    cmp $6, %rax
    je fast_file
    cmp $262, %rax
    je fast_file
    cmp $2, %rax
    je fast_file
    cmp $257, %rax
    je fast_file
    cmp $3, %rax
    je fast_file
    /* fall through: everything else */

fast_escalate:
    mov {s_rax}(%rsp), %rax
    fast_restore
    mov {s_rsp}(%rsp), %rsp
    jmp ring3_syscall_page

fast_getpid:
    mov FAST_CPU_DATA + {pid}(%rsp), %rax
    jmp fast_return
fast_gettid:
    mov FAST_CPU_DATA + {tid}(%rsp), %rax
    jmp fast_return
fast_getppid:
    mov FAST_CPU_DATA + {ppid}(%rsp), %rax
    jmp fast_return
    /* Three ids, written in order as the kernel path writes them (after a fault there, it
       writes them again and fails where this code did). */
fast_getres:
    fast_user_range %rdi, 4
    fast_user_range %rsi, 4
    fast_user_range %rdx, 4
    movl $0, (%rdi)
    movl $0, (%rsi)
    movl $0, (%rdx)
fast_zero:
    xor %eax, %eax
    jmp fast_return

    /* clock_gettime(id, tp): ids 0-11 (REALTIME, its COARSE and TAI from the wall clock, the
       CPU-time clocks the job's and the thread's time, the others monotonic, as the kernel's
       clock_gettime); other ids to the kernel. */
fast_clock_gettime:
    cmp $11, %rdi
    ja fast_escalate
    fast_user_range %rsi, 16
    fast_monotonic
    cmp $2, %rdi
    je 3f
    cmp $3, %rdi
    je 4f
    cmp $0, %rdi
    je 1f
    cmp $5, %rdi
    je 1f
    cmp $11, %rdi
    jne 2f
1:  add FAST_DATA + {boot_realtime}(%rip), %rax
2:  fast_divide 1000000000
    mov %rax, (%rsi)
    mov %rdx, 8(%rsi)
    xor %eax, %eax
    jmp fast_return
3:  sub FAST_DATA + {job_start}(%rip), %rax   /* the process's CPU time: the job's */
    jmp 2b
4:  add FAST_CPU_DATA + {thread_clock}(%rsp), %rax   /* the thread's own */
    jmp 2b

    /* clock_getres(id, res): one nanosecond. */
fast_clock_getres:
    cmp $11, %rdi
    ja fast_escalate
    test %rsi, %rsi
    jz 1f
    fast_user_range %rsi, 16
    movq $0, (%rsi)
    movq $1, 8(%rsi)
1:  xor %eax, %eax
    jmp fast_return

    /* getrusage(who, usage): RUSAGE_SELF (0) and RUSAGE_THREAD (1); the job's time or the
       thread's as user time, everything else zero. RUSAGE_CHILDREN and bad values go to the kernel. */
fast_getrusage:
    cmp $1, %rdi
    ja fast_escalate
    fast_user_range %rsi, 144
    fast_monotonic
    cmp $1, %rdi
    je 1f
    sub FAST_DATA + {job_start}(%rip), %rax
    jmp 2f
1:  add FAST_CPU_DATA + {thread_clock}(%rsp), %rax   /* RUSAGE_THREAD: the thread's own */
2:  fast_divide 1000000000
    mov %rax, (%rsi)
    mov %rdx, %rax
    fast_divide 1000
    mov %rax, 8(%rsi)
    lea 16(%rsi), %rdi
    mov $16, %ecx
    xor %eax, %eax
    rep stosq                          /* DF is clear: SYSCALL masked it */
    jmp fast_return

    /* times(buf): the job's time as user time and the clock since boot, in 100 Hz ticks. */
fast_times:
    test %rdi, %rdi
    jz 1f
    fast_user_range %rdi, 32
1:  fast_monotonic
    mov %rax, %rsi
    test %rdi, %rdi
    jz 2f
    sub FAST_DATA + {job_start}(%rip), %rax
    fast_divide 10000000
    mov %rax, (%rdi)
    movq $0, 8(%rdi)
    movq $0, 16(%rdi)
    movq $0, 24(%rdi)
2:  mov %rsi, %rax
    fast_divide 10000000
    jmp fast_return

    /* getcpu(cpu, node, cache): this CPU, node 0. */
fast_getcpu:
    test %rdi, %rdi
    jz 1f
    fast_user_range %rdi, 4
    mov FAST_CPU_DATA + {cpu}(%rsp), %eax
    mov %eax, (%rdi)
1:  test %rsi, %rsi
    jz 2f
    fast_user_range %rsi, 4
    movl $0, (%rsi)
2:  xor %eax, %eax
    jmp fast_return

    /* sched_yield(): nothing to do when no other thread waits for this CPU. */
fast_sched_yield:
    mov FAST_CPU_DATA + {cpu}(%rsp), %rax
    lea FAST_DATA + {queued}(%rip), %rcx
    cmpq $0, (%rcx, %rax, 8)
    jne fast_escalate
    xor %eax, %eax
    jmp fast_return

    /* The file calls: into this CPU's slot of the process's request page, for the host to
       serve (read, write, pread64, pwrite64, lseek, fstat and close of descriptors 3 and up;
       open, openat, stat, lstat and newfstatat of a path, copied in, unless the host does not
       know the job's own files). */
fast_file:
    cmpq $0, FAST_CPU_DATA + {files_ready}(%rsp)
    je fast_escalate                   /* the host does not know this process here yet */
    mov FAST_CPU_DATA + {cpu}(%rsp), %r11
    shl ${slot_shift}, %r11
    movabs ${request_page}, %rcx
    add %rcx, %r11                     /* R11: the slot */
    mov %rax, {r_call}(%r11)
    mov %rdi, {r_args}(%r11)
    mov %rsi, {r_args} + 8(%r11)
    mov %rdx, {r_args} + 16(%r11)
    mov %r10, {r_args} + 24(%r11)
    cmp $4, %eax
    je 1f
    cmp $6, %eax
    je 1f
    cmp $2, %eax                       /* open: the path is the first argument */
    je 1f
    cmp $262, %eax
    je 2f
    cmp $257, %eax                     /* openat: the second */
    je 2f
    cmp $3, %edi                       /* the console streams stay the kernel's */
    jb fast_escalate
    jmp 4f
2:  mov %rsi, %rdi                     /* newfstatat: the path is the second argument */
1:  cmpl $0, FAST_DATA + {job_files}(%rip)
    jne fast_escalate
    xor %ecx, %ecx
3:  movzbl (%rdi, %rcx), %eax          /* a bad pointer faults: the kernel path says EFAULT */
    mov %al, {r_path}(%r11, %rcx)
    test %al, %al
    jz 4f
    inc %ecx
    cmp ${path_capacity}, %ecx
    jb 3b
    jmp fast_escalate                  /* too long for the slot */
4:  mov FAST_DATA + {wait_ticks}(%rip), %rsi
    cmpq $0, {r_awake}(%r11)
    je 5f
    mov FAST_DATA + {wait_ticks} + 8(%rip), %rsi   /* the host polls: wait longer */
5:  rdtsc
    shl $32, %rdx
    or %rdx, %rax
    add %rax, %rsi                     /* RSI: when to take the call back */
    movq ${posted}, {r_state}(%r11)
    /* From here the call may be in the host's hands: an entry to the kernel finishes it
       (`abort_interrupted`), so it is never made twice. */
fast_file_posted:
    pause
    mov {r_state}(%r11), %rax
    cmp ${answered}, %rax
    je 6f
    cmp ${posted}, %rax
    jne fast_file_posted               /* taken: the host is serving it */
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    cmp %rsi, %rax
    jb fast_file_posted
    mov ${posted}, %eax                /* not taken in time: take it back */
    xor %ecx, %ecx
    lock cmpxchg %rcx, {r_state}(%r11)
    jne fast_file_posted               /* it was taken meanwhile */
    jmp fast_escalate
6:  mov {r_result}(%r11), %rax
    movabs ${escalate}, %rcx
    cmp %rcx, %rax
    je fast_escalate                   /* the host sends it to the kernel */
    fast_restore
    and ${user_flags}, %r11
    or $0x202, %r11
    mov %r11, {s_flags}(%rsp)
    lea {s_flags}(%rsp), %rsp
    popfq
    mov {s_rsp} - {s_flags} - 8(%rsp), %rsp
    jmp *%rcx
fast_file_end:

fast_uname:
    fast_user_range %rdi, {utsname_size}
    lea FAST_DATA + {utsname}(%rip), %rsi
    mov ${utsname_size}, %ecx
    rep movsb
    xor %eax, %eax
    /* fall through */

    /* RAX holds the answer. RCX and R11 end as the kernel path leaves them: the return
       address, and the flags it returns with. */
fast_return:
    fast_restore
    and ${user_flags}, %r11
    or $0x202, %r11
    mov %r11, {s_flags}(%rsp)
    lea {s_flags}(%rsp), %rsp
    popfq                              /* in ring 3 IF and IOPL stay as they are */
    mov {s_rsp} - {s_flags} - 8(%rsp), %rsp
    jmp *%rcx

    /* A thread whose file call the host served while it gave its CPU to others collects
       the answer here, in the kernel (`abort_interrupted`), with the caller's registers. */
fast_file_collect:
    ud2

fast_end:
    .balign 4096
    .text
"#,
    page = const PAGE_SIZE,
    data_page = const DATA_PAGE,
    entry_size = const ENTRY_SIZE,
    slot_size = const SLOT_SIZE,
    s_rax = const slot::RAX,
    s_rcx = const slot::RCX,
    s_r11 = const slot::R11,
    s_rdx = const slot::RDX,
    s_rsi = const slot::RSI,
    s_rdi = const slot::RDI,
    s_rsp = const slot::RSP,
    s_flags = const slot::FLAGS,
    tid = const offset_of!(CpuData, tid),
    pid = const offset_of!(CpuData, pid),
    ppid = const offset_of!(CpuData, ppid),
    cpu = const offset_of!(CpuData, cpu),
    thread_clock = const offset_of!(CpuData, thread_clock),
    files_ready = const offset_of!(CpuData, files_ready),
    job_files = const offset_of!(FastData, job_files),
    slot_shift = const RING3_SLOT_SIZE.trailing_zeros(),
    request_page = const RING3_REQUEST_PAGE,
    r_call = const RING3_CALL,
    r_args = const RING3_ARGS,
    r_path = const RING3_PATH,
    r_state = const RING3_STATE,
    r_result = const RING3_RESULT,
    path_capacity = const RING3_PATH_CAPACITY,
    posted = const enclave_proto::slots::POSTED,
    answered = const enclave_proto::slots::ANSWERED,
    escalate = const RING3_ESCALATE,
    wait_ticks = const offset_of!(FastData, file_wait_ticks),
    r_awake = const RING3_HOST_AWAKE,
    signal_check = const offset_of!(FastData, signal_check),
    queued = const offset_of!(FastData, queued),
    job_start = const offset_of!(FastData, job_start_ns),
    boot_tsc = const offset_of!(FastData, boot_tsc),
    multiplier = const offset_of!(FastData, tsc_multiplier),
    shift = const offset_of!(FastData, tsc_shift),
    boot_realtime = const offset_of!(FastData, boot_realtime_ns),
    utsname = const offset_of!(FastData, utsname),
    utsname_size = const UTSNAME_SIZE,
    user_flags = const USER_FLAGS,
    options(att_syntax)
);

extern "C" {
    static ring3_syscall_page: u8;
    static fast_entries: u8;
    static fast_entries_end: u8;
    static fast_saved: u8;
    static fast_file_posted: u8;
    static fast_file_end: u8;
    static fast_file_collect: u8;
    static fast_end: u8;
}
