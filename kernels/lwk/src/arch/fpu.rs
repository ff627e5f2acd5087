//! User FPU, SSE and AVX state, saved per thread when a CPU switches threads. The kernel is
//! built soft-float and never touches these registers, so they hold the running thread's
//! state whenever the kernel runs; a system call that blocks, or a time slice that ends,
//! must not leak one thread's vector registers into another.
//!
//! Three ways to switch it (`Method`). FXSAVE covers x87 and SSE only. XSAVE in the kernel
//! covers every component XCR0 enables (AVX, AVX-512). On the PVM host kernel code is
//! emulated and PVM's emulator knows neither XSAVE nor XRSTOR (clowder-vmm now carries them out
//! itself, for Linux guests: `vmm::emulate`, two VM exits and ~22 us a pair; the stubs below were
//! not measured against that), while user code runs natively with the host's XCR0; there the
//! kernel runs them in ring 3
//! (`Method::Ring3Xsave`): a read-only user page (`STUB_PAGE`, mapped into every address
//! space) holds a few stubs, each one or two XSAVE-family instructions and a `ud2`. The
//! kernel "calls" a stub with IRETQ (interrupts off, the thread's address space loaded, RSP0
//! pointing just below its own stack frame) and the stub's `ud2` brings it back there
//! (`arch::trap::run_ring3_stub`). Each thread's area is a kernel page mapped at
//! `USER_AREAS + slot * 4 KiB` in its own process only (on the first stub that touches it,
//! unmapped when the thread ends), so a job can read its own threads' saved registers but
//! never another process's. A thread's registers are saved when it leaves its CPU and loaded
//! when it comes back, unless that CPU still holds them (nothing else ran there meanwhile).

use super::paging::PAGE_SIZE;
use super::tables::{self, MAX_CPUS};
use super::trap::{copy_from_user, copy_to_user, UserFault, MAX_THREADS};
use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Method {
    /// FXSAVE/FXRSTOR in the kernel: x87 and SSE (XCR0 enables only those).
    Fxsave,
    /// XSAVE/XRSTOR in the kernel: every user component XCR0 enables.
    Xsave,
    /// XSAVE/XRSTOR in ring 3, through the stubs of `STUB_PAGE`.
    Ring3Xsave,
}

static METHOD: AtomicU8 = AtomicU8::new(Method::Fxsave as u8);

pub fn method() -> Method {
    match METHOD.load(Ordering::Relaxed) {
        1 => Method::Xsave,
        2 => Method::Ring3Xsave,
        _ => Method::Fxsave,
    }
}

/// Save areas by thread context slot (physical pages, 0 until the slot's first use), then
/// one scratch area per CPU for signal frames (`SCRATCH_SLOTS`).
static AREAS: [AtomicU64; MAX_THREADS + MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_THREADS + MAX_CPUS];
static AREA_SIZE: AtomicUsize = AtomicUsize::new(512);
/// XCR0: the state components XSAVE switches (with XSAVE only).
static COMPONENTS: AtomicU64 = AtomicU64::new(0b11);
const SCRATCH_SLOTS: usize = MAX_THREADS;
/// The MXCSR bits the CPU supports (read once: an FXSAVE is costly emulated work on PVM).
static SUPPORTED_MXCSR: AtomicU32 = AtomicU32::new(0xffbf);

/// Per CPU: 1 + the slot whose state its registers hold (0: none known).
static LIVE: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];
/// Per slot: 1 + the CPU whose registers last held its state (0: none, or stale).
static LAST_CPU: [AtomicUsize; MAX_THREADS] = [const { AtomicUsize::new(0) }; MAX_THREADS];
/// Per CPU: 1 + the slots whose save areas the running ring-3 stub may map on first touch
/// (0: none): only the kernel's own requests, never an address the job chose.
static STUB_AREAS: [[AtomicUsize; 2]; MAX_CPUS] = [const { [const { AtomicUsize::new(0) }; 2] }; MAX_CPUS];
/// Per CPU: a tick arrived while a ring-3 stub ran; it is raised again once the stub is done.
static TICK_DEFERRED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

/// Where each thread's save area is mapped in its process (`Method::Ring3Xsave`): one page
/// per context slot, above the stack, below `STUB_PAGE`.
pub const USER_AREAS: u64 = 0x0000_7fff_ffe0_0000;
/// The read-only, executable page of ring-3 stubs (`Method::Ring3Xsave`), mapped into every
/// address space.
pub const STUB_PAGE: u64 = USER_AREAS + MAX_THREADS as u64 * PAGE_SIZE;

/// The stubs' offsets in `STUB_PAGE` (see the assembly below).
const STUB_SAVE: u64 = 0;
const STUB_RESTORE: u64 = 16;
const STUB_TO_SIGNAL_FRAME: u64 = 32;
const STUB_INITIAL_STATE: u64 = 48;
const STUB_FROM_SIGNAL_FRAME: u64 = 64;
const STUB_FROM_LEGACY_FRAME: u64 = 96;
const STUB_SWITCH: u64 = 112;

/// How threads' state is switched: XSAVE when the CPU has it, in ring 3 under clowder-vmm
/// (on the PVM host each kernel-mode XSAVE is an exit to the VMM), unless the command line
/// says otherwise (`lwk.fpu=xsave|ring3|fxsave`).
pub fn method_wanted(command_line_choice: Option<&str>, under_clowder_vmm: bool) -> Method {
    let has_xsave = super::cpu::cpuid(1, 0).ecx & (1 << 26) != 0;
    match command_line_choice {
        _ if !has_xsave => Method::Fxsave,
        Some("fxsave") => Method::Fxsave,
        Some("xsave") => Method::Xsave,
        Some("ring3") => Method::Ring3Xsave,
        _ if under_clowder_vmm => Method::Ring3Xsave,
        _ => Method::Xsave,
    }
}

/// Switches threads' state with `method` (after `enable_user_fpu` has set XCR0 for it).
pub fn init(method: Method) {
    SUPPORTED_MXCSR.store(mxcsr_mask_of_this_cpu(), Ordering::Relaxed);
    METHOD.store(method as u8, Ordering::Relaxed);
    if method == Method::Fxsave {
        return;
    }
    // The components `enable_user_fpu` put in XCR0 (computed, not read back: under PVM the
    // kernel's XGETBV is emulated while user code sees the host's XCR0), and the standard
    // form's size for them (CPUID leaf 0xd: each component's size and offset).
    let components = super::cpu::user_xstate_components(true);
    COMPONENTS.store(components, Ordering::Relaxed);
    let size = (2..63)
        .filter(|component| components & 1 << component != 0)
        .map(|component| {
            let leaf = super::cpu::cpuid(0xd, component);
            (leaf.ebx + leaf.eax) as usize
        })
        .fold(XSAVE_HEADER + 64, usize::max);
    assert!(size <= PAGE_SIZE as usize, "an XSAVE area of {size} bytes does not fit a page");
    AREA_SIZE.store(size, Ordering::Relaxed);
}

pub fn uses_xsave() -> bool {
    method() != Method::Fxsave
}

/// The physical page holding `slot`'s area (allocated, zeroed, on first use; kept for good,
/// slots are reused).
fn area(slot: usize) -> u64 {
    let existing = AREAS[slot].load(Ordering::Acquire);
    if existing != 0 {
        return existing;
    }
    let fresh = crate::mm::pmem::allocate(PAGE_SIZE, PAGE_SIZE).expect("no memory for an FPU save area");
    AREAS[slot].store(fresh, Ordering::Release);
    fresh
}

fn area_bytes(slot: usize) -> &'static mut [u8] {
    // SAFETY: the area is a page of the kernel's own, used for this slot only, one borrow at
    // a time (callers drop it before returning).
    unsafe { core::slice::from_raw_parts_mut(super::phys::to_virtual(area(slot)) as *mut u8, AREA_SIZE.load(Ordering::Relaxed)) }
}

/// Where `slot`'s area is mapped in its process (`Method::Ring3Xsave`).
fn user_area(slot: usize) -> u64 {
    USER_AREAS + slot as u64 * PAGE_SIZE
}

/// The context slot whose area the stub running on `cpu` faulted on at `address`, if the
/// kernel asked that stub to use that area (it is then mapped into the running process).
pub fn area_slot_of(cpu: usize, address: u64) -> Option<usize> {
    let slot = (address.checked_sub(USER_AREAS)? / PAGE_SIZE) as usize;
    STUB_AREAS[cpu].iter().any(|area| area.load(Ordering::Relaxed) == slot + 1).then_some(slot)
}

/// The physical page and user address of `slot`'s area, for mapping it into its process.
pub fn area_mapping(slot: usize) -> (u64, u64) {
    (area(slot), user_area(slot))
}

/// Whether `frame` is a trap from a ring-3 stub the kernel is running: in the stub page, in
/// ring 3 with interrupts off, which only the kernel can arrange (a job that jumps there
/// has IF set, and faults as any user code).
pub fn is_stub_frame(frame: &super::trap::TrapFrame) -> bool {
    const INTERRUPTS_ENABLED: u64 = 1 << 9;
    method() == Method::Ring3Xsave
        && frame.is_from_user()
        && frame.rflags & INTERRUPTS_ENABLED == 0
        && (STUB_PAGE..STUB_PAGE + PAGE_SIZE).contains(&frame.rip)
}

/// The physical page of the stubs, to map at `STUB_PAGE` (`None` unless `Ring3Xsave`).
pub fn stub_page_physical() -> Option<u64> {
    (method() == Method::Ring3Xsave).then(|| &raw const xstate_stubs as u64 - super::phys::KERNEL_VMA)
}

/// A tick interrupted a stub: its handler ran (end of interrupt, TLB flush) but the tick's
/// work (time slice, signals, parking) waits until the stub is done.
pub fn defer_tick(cpu: usize) {
    TICK_DEFERRED[cpu].store(true, Ordering::Relaxed);
}

/// Runs the stub at `offset` in ring 3 with RDI = `address`, RSI = `rsi`, EDX:EAX = the
/// components; it may have the save areas of the `areas` slots mapped on first touch. Fails
/// if it faulted (an address the user made bad, or an XRSTOR the CPU refused).
fn run_stub(cpu: usize, offset: u64, address: u64, rsi: u64, areas: [Option<usize>; 2]) -> Result<(), UserFault> {
    for (allowed, slot) in STUB_AREAS[cpu].iter().zip(areas) {
        allowed.store(slot.map_or(0, |slot| slot + 1), Ordering::Relaxed);
    }
    let stack = tables::kernel_stack(cpu);
    // SAFETY: the stub page is mapped in the loaded address space (`Ring3Xsave` maps it into
    // every one); interrupts are off; the stub returns through `ud2` or a trap that
    // `abandon_stub` ends.
    let failed = unsafe {
        super::trap::run_ring3_stub(STUB_PAGE + offset, tables::kernel_stack_field(cpu), address, COMPONENTS.load(Ordering::Relaxed), rsi)
    };
    tables::set_kernel_stack(cpu, stack);
    if TICK_DEFERRED[cpu].swap(false, Ordering::Relaxed) {
        super::apic::arm_timer(super::cpu::read_tsc());
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(UserFault)
    }
}

/// A stub faulted in a way the kernel does not repair: it returns failure to `run_stub`.
pub fn abandon_stub(frame: &super::trap::TrapFrame) -> ! {
    // SAFETY: the frame lies right below `run_ring3_stub`'s saved registers (RSP0 pointed
    // there), so the stack above it is that call's.
    unsafe { super::trap::ring3_stub_failed(frame as *const _ as u64 + core::mem::size_of::<super::trap::TrapFrame>() as u64) }
}

/// Saves the registers of the thread running on `cpu` into its area, and returns its slot
/// (`None` if this CPU holds no thread's state). Called with the thread's address space
/// loaded: as it leaves the CPU, and when it creates a thread or process (which starts with
/// a copy).
pub fn save_running(cpu: usize) -> Option<usize> {
    let slot = LIVE[cpu].load(Ordering::Relaxed).checked_sub(1)?;
    transfer(cpu, slot, Transfer::Save);
    Some(slot)
}

/// Which way `transfer` moves a thread's state.
#[derive(Clone, Copy, PartialEq)]
enum Transfer {
    /// From `cpu`'s registers into `slot`'s area.
    Save,
    /// From `slot`'s area into `cpu`'s registers.
    Restore,
}

/// Moves `slot`'s state between its area and `cpu`'s registers, with this boot's method.
/// Called with the thread's address space loaded.
fn transfer(cpu: usize, slot: usize, way: Transfer) {
    let save = way == Transfer::Save;
    match method() {
        Method::Ring3Xsave => {
            let stub = if save { STUB_SAVE } else { STUB_RESTORE };
            if run_stub(cpu, stub, user_area(slot), 0, [Some(slot), None]).is_err() {
                crate::console::log!("the save area of a thread (slot {slot}) is unusable: its vector registers are lost");
            }
        }
        // SAFETY: the area is page aligned and large enough for the enabled components; a
        // restore reads a state saved by `save_running` or `inherit` for this method.
        Method::Xsave => unsafe {
            let area = area_bytes(slot).as_mut_ptr();
            if save {
                asm!("xsave64 [{}]", in(reg) area, in("eax") u32::MAX, in("edx") u32::MAX, options(nostack))
            } else {
                asm!("xrstor64 [{}]", in(reg) area, in("eax") u32::MAX, in("edx") u32::MAX, options(nostack))
            }
        },
        // SAFETY: as above, 512 bytes.
        Method::Fxsave => unsafe {
            let area = area_bytes(slot).as_mut_ptr();
            if save {
                asm!("fxsave64 [{}]", in(reg) area, options(nostack))
            } else {
                asm!("fxrstor64 [{}]", in(reg) area, options(nostack))
            }
        },
    }
}

/// A new thread in `slot` starts with the state saved for `creator` (`save_running`), or the
/// initial state if there is none.
pub fn inherit(slot: usize, creator: Option<usize>) {
    let size = AREA_SIZE.load(Ordering::Relaxed);
    match creator {
        Some(creator) => {
            let source: &[u8] = area_bytes(creator);
            area_bytes(slot).copy_from_slice(&source[..size]);
        }
        None => {
            let area = area_bytes(slot);
            area.fill(0);
            let len = area.len().min(XSAVE_HEADER + 64);
            area[..len].copy_from_slice(&initial_image()[..len]);
        }
    }
    LAST_CPU[slot].store(0, Ordering::Relaxed);
}

/// Makes `cpu`'s registers hold `slot`'s state (saved when it left a CPU), unless they
/// still do. Called with the thread's address space loaded, before it resumes.
pub fn resume(cpu: usize, slot: usize) {
    if LIVE[cpu].load(Ordering::Relaxed) == slot + 1 && LAST_CPU[slot].load(Ordering::Relaxed) == cpu + 1 {
        return;
    }
    transfer(cpu, slot, Transfer::Restore);
    LIVE[cpu].store(slot + 1, Ordering::Relaxed);
    LAST_CPU[slot].store(cpu + 1, Ordering::Relaxed);
}

/// The thread in slot `from` leaves `cpu` for the one in slot `to`, both of the loaded
/// address space: `save_running` and `resume` in one ring-3 trip rather than two (`to`'s
/// area must be complete: `arch::trap::wait_until_saved`).
pub fn switch_threads(cpu: usize, from: usize, to: usize) {
    let from_is_live = LIVE[cpu].load(Ordering::Relaxed) == from + 1;
    if method() != Method::Ring3Xsave || !from_is_live || from == to {
        if from_is_live {
            save_running(cpu);
        }
        return resume(cpu, to);
    }
    if run_stub(cpu, STUB_SWITCH, user_area(from), user_area(to), [Some(from), Some(to)]).is_err() {
        crate::console::log!("the save area of a thread (slot {from} or {to}) is unusable: its vector registers are lost");
    }
    LIVE[cpu].store(to + 1, Ordering::Relaxed);
    LAST_CPU[to].store(cpu + 1, Ordering::Relaxed);
}

/// The job's first thread starts in `slot` on `cpu` with the initial state (nothing of the
/// last job's registers).
pub fn start_first_thread(cpu: usize, slot: usize) {
    load_initial_state();
    LIVE[cpu].store(slot + 1, Ordering::Relaxed);
    LAST_CPU[slot].store(cpu + 1, Ordering::Relaxed);
}

/// The user address of an ended thread's area, to unmap from its process
/// (`Method::Ring3Xsave`); its slot's state is no longer anyone's.
pub fn thread_ended(cpu: usize, slot: usize) -> Option<u64> {
    if LIVE[cpu].load(Ordering::Relaxed) == slot + 1 {
        LIVE[cpu].store(0, Ordering::Relaxed);
    }
    LAST_CPU[slot].store(0, Ordering::Relaxed);
    (method() == Method::Ring3Xsave).then(|| user_area(slot))
}

/// Offsets in an FXSAVE image / XSAVE area.
const MXCSR: usize = 24;
const MXCSR_MASK: usize = 28;
const LEGACY_SIZE: usize = 512;
/// Linux's `struct _fpx_sw_bytes` in the image's unused tail: magic1, extended size,
/// components, XSAVE area size.
const SW_BYTES: usize = 464;
const SW_BYTES_SIZE: usize = 20;
const XSAVE_HEADER: usize = 512;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
const MAGIC2_SIZE: usize = 4;
const X87_AND_SSE: u64 = 0b11;

global_asm!(
    r#"
    /* The ring-3 stubs (`Method::Ring3Xsave`), a page of their own mapped read-only at
       STUB_PAGE: RDI = an area, EDX:EAX = the components; each ends in the ud2 that returns
       to the kernel (`arch::trap`). The offsets are the STUB_* constants. */
    .section .text.xstate_stubs, "ax"
    .balign 4096
xstate_stubs:
    xsave64 (%rdi)                     /* 0: save */
    ud2
    .org xstate_stubs + 16
    xrstor64 (%rdi)                    /* 16: restore */
    ud2
    .org xstate_stubs + 32
    xsave64 (%rdi)                     /* 32: into a signal frame; the handler starts afresh */
    xrstor64 xstate_initial(%rip)
    ud2
    .org xstate_stubs + 48
    xrstor64 xstate_initial(%rip)      /* 48: the initial state */
    ud2
    .org xstate_stubs + 64
    xrstor64 xstate_initial(%rip)      /* 64: from a signal frame, the components in ESI; */
    mov %esi, %eax                     /* the others start afresh */
    xor %edx, %edx
    xrstor64 (%rdi)
    ud2
    .org xstate_stubs + 96
    xrstor64 xstate_initial(%rip)      /* 96: from a legacy (FXSAVE) signal frame */
    fxrstor64 (%rdi)
    ud2
    .org xstate_stubs + 112
    xsave64 (%rdi)                     /* 112: save, then restore the area at RSI */
    xrstor64 (%rsi)
    ud2
    /* What a signal handler starts with, as on Linux: x87 and SSE at their reset values
       (FCW 0x37f, MXCSR 0x1f80, registers zero), every other component in its initial
       state (its XSTATE_BV bit clear). */
    .balign 64
xstate_initial:
    .word 0x37f
    .org xstate_initial + 24
    .long 0x1f80
    .org xstate_initial + 512
    .quad 3
    .org xstate_initial + 576
    .balign 4096
    .text
"#,
    options(att_syntax)
);

extern "C" {
    static xstate_stubs: u8;
    static xstate_initial: u8;
}

/// The initial state's image (legacy area and XSAVE header), 64-byte aligned.
fn initial_image() -> &'static [u8] {
    // SAFETY: `xstate_initial` is 576 bytes of read-only data (above).
    unsafe { core::slice::from_raw_parts(&raw const xstate_initial, XSAVE_HEADER + 64) }
}

/// Whether a signal frame's `fpstate` is the XSAVE area (`UC_FP_XSTATE` in `uc_flags`).
pub fn signal_frame_has_xstate() -> bool {
    uses_xsave()
}

/// Bytes of `fpstate` in a signal frame: Linux's layout, the XSAVE area (standard form)
/// followed by FP_XSTATE_MAGIC2 with XSAVE, the 512-byte legacy image with FXSAVE.
pub fn signal_frame_size() -> u64 {
    if uses_xsave() {
        (AREA_SIZE.load(Ordering::Relaxed) + MAGIC2_SIZE) as u64
    } else {
        LEGACY_SIZE as u64
    }
}

/// This CPU's scratch area for signal frames. The kernel runs with interrupts off, so
/// nothing else on this CPU uses it meanwhile.
fn scratch() -> &'static mut [u8] {
    area_bytes(SCRATCH_SLOTS + tables::current_cpu())
}

fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}

/// Linux's software bytes for an XSAVE area of `size` bytes: FP_XSTATE_MAGIC1, the size
/// with FP_XSTATE_MAGIC2, the components, the size.
fn software_bytes(size: usize) -> [u8; SW_BYTES_SIZE] {
    let mut bytes = [0u8; SW_BYTES_SIZE];
    bytes[0..4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    bytes[4..8].copy_from_slice(&((size + MAGIC2_SIZE) as u32).to_le_bytes());
    bytes[8..16].copy_from_slice(&COMPONENTS.load(Ordering::Relaxed).to_le_bytes());
    bytes[16..20].copy_from_slice(&(size as u32).to_le_bytes());
    bytes
}

/// Writes the running thread's vector registers into a signal frame's `fpstate` at
/// `user_address` (`signal_frame_size` bytes, 64-byte aligned), then gives the registers
/// their initial values for the handler.
pub fn save_to_signal_frame(user_address: u64) -> Result<(), UserFault> {
    let size = AREA_SIZE.load(Ordering::Relaxed);
    match method() {
        Method::Ring3Xsave => {
            // XSAVE writes XSTATE_BV but not the rest of the header, which must be zero.
            copy_to_user(user_address + XSAVE_HEADER as u64, &[0; 64])?;
            run_stub(tables::current_cpu(), STUB_TO_SIGNAL_FRAME, user_address, 0, [None, None])?;
            // As Linux: x87 and SSE always present (FXRSTOR-compatible), then the software bytes.
            let mut present = [0u8; 8];
            copy_from_user(&mut present, user_address + XSAVE_HEADER as u64)?;
            copy_to_user(user_address + XSAVE_HEADER as u64, &(u64::from_le_bytes(present) | X87_AND_SSE).to_le_bytes())?;
            copy_to_user(user_address + SW_BYTES as u64, &software_bytes(size))?;
            // The stub loaded the initial state already.
            return copy_to_user(user_address + size as u64, &FP_XSTATE_MAGIC2.to_le_bytes());
        }
        Method::Xsave => {
            let area = scratch();
            // Components in their initial state are not written: clear what another frame left.
            area.fill(0);
            // SAFETY: the area is page aligned and large enough for the enabled components.
            unsafe { asm!("xsave64 [{}]", in(reg) area.as_mut_ptr(), in("eax") u32::MAX, in("edx") u32::MAX, options(nostack)) };
            area[XSAVE_HEADER] |= X87_AND_SSE as u8;
            area[SW_BYTES..SW_BYTES + SW_BYTES_SIZE].copy_from_slice(&software_bytes(size));
            copy_to_user(user_address, area)?;
            copy_to_user(user_address + size as u64, &FP_XSTATE_MAGIC2.to_le_bytes())?;
        }
        Method::Fxsave => {
            let mut area = LegacyArea([0; LEGACY_SIZE]);
            // SAFETY: the area is 16-byte aligned and 512 bytes long, what FXSAVE writes.
            unsafe { asm!("fxsave64 [{}]", in(reg) area.0.as_mut_ptr(), options(nostack)) };
            copy_to_user(user_address, &area.0)?;
        }
    }
    load_initial_state();
    Ok(())
}

/// The initial x87/SSE/AVX state (`xstate_initial`), as a signal handler gets it.
pub fn load_initial_state() {
    match method() {
        Method::Ring3Xsave => {
            // Fails only if the job unmapped the stub page; it then keeps its registers.
            let _ = run_stub(tables::current_cpu(), STUB_INITIAL_STATE, 0, 0, [None, None]);
        }
        // SAFETY: a valid image: reset FCW and MXCSR, a header naming only x87 and SSE.
        Method::Xsave => unsafe {
            asm!("xrstor64 [{}]", in(reg) initial_image().as_ptr(), in("eax") u32::MAX, in("edx") u32::MAX, options(nostack))
        },
        // SAFETY: as above.
        Method::Fxsave => unsafe { asm!("fxrstor64 [{}]", in(reg) initial_image().as_ptr(), options(nostack)) },
    }
}

/// A signal frame's `fpstate` that cannot be read, or that XRSTOR/FXRSTOR would refuse.
pub struct BadFpstate;

impl From<UserFault> for BadFpstate {
    fn from(_: UserFault) -> BadFpstate {
        BadFpstate
    }
}

/// Loads the vector registers from a signal frame's `fpstate` at `user_address`, which the
/// handler may have changed. With XSAVE, a frame whose software bytes and FP_XSTATE_MAGIC2
/// describe this kernel's XSAVE area is loaded whole (the components its software bytes
/// name); any other is taken as a legacy image (x87 and SSE; the other components start
/// over), as Linux does. What the CPU would refuse (reserved MXCSR bits, components XCR0
/// lacks, a non-zero reserved header field) is checked first and refused, as Linux refuses
/// the frame when XRSTOR faults (in ring 3, a frame another thread changes meanwhile makes
/// the stub fault: refused too).
pub fn restore_from_signal_frame(user_address: u64) -> Result<(), BadFpstate> {
    if method() == Method::Fxsave {
        let mut area = LegacyArea([0; LEGACY_SIZE]);
        copy_from_user(&mut area.0, user_address)?;
        if read_u32(&area.0, MXCSR) & !SUPPORTED_MXCSR.load(Ordering::Relaxed) != 0 {
            return Err(BadFpstate);
        }
        // SAFETY: a 16-byte aligned 512-byte image with only supported MXCSR bits set; the
        // other fields cannot fault on FXRSTOR.
        unsafe { asm!("fxrstor64 [{}]", in(reg) area.0.as_ptr(), options(nostack)) };
        return Ok(());
    }
    let size = AREA_SIZE.load(Ordering::Relaxed);
    let components = COMPONENTS.load(Ordering::Relaxed);
    let mut software = [0u8; SW_BYTES_SIZE];
    copy_from_user(&mut software, user_address + SW_BYTES as u64)?;
    let mut magic2 = [0u8; MAGIC2_SIZE];
    let whole = read_u32(&software, 0) == FP_XSTATE_MAGIC1
        && read_u32(&software, 4) as usize == size + MAGIC2_SIZE
        && read_u32(&software, 16) as usize == size
        && copy_from_user(&mut magic2, user_address + size as u64).is_ok()
        && u32::from_le_bytes(magic2) == FP_XSTATE_MAGIC2;
    let requested = if whole {
        let mut header = [0u8; 64];
        copy_from_user(&mut header, user_address + XSAVE_HEADER as u64)?;
        if read_u64(&header, 0) & !components != 0 || header[8..].iter().any(|&byte| byte != 0) {
            return Err(BadFpstate);
        }
        read_u64(&software, 8) & components
    } else {
        X87_AND_SSE
    };
    if method() == Method::Ring3Xsave {
        // Checked here too: not every CPU or emulator faults on them (QEMU's TCG does not).
        let mut mxcsr = [0u8; 4];
        copy_from_user(&mut mxcsr, user_address + MXCSR as u64)?;
        if u32::from_le_bytes(mxcsr) & !SUPPORTED_MXCSR.load(Ordering::Relaxed) != 0 {
            return Err(BadFpstate);
        }
        return restore_in_ring3(user_address, whole, requested);
    }
    let area = scratch();
    copy_from_user(&mut area[..if whole { size } else { LEGACY_SIZE }], user_address)?;
    if read_u32(area, MXCSR) & !SUPPORTED_MXCSR.load(Ordering::Relaxed) != 0 {
        return Err(BadFpstate);
    }
    if !whole {
        // A legacy image: the header is not the user's; x87 and SSE from the image.
        area[XSAVE_HEADER..XSAVE_HEADER + 64].fill(0);
    }
    // Components the frame does not name start over (their XSTATE_BV bit cleared), as Linux
    // initialises them.
    let present = read_u64(area, XSAVE_HEADER) & requested | if whole { 0 } else { X87_AND_SSE };
    area[XSAVE_HEADER..XSAVE_HEADER + 8].copy_from_slice(&present.to_le_bytes());
    // SAFETY: a 64-byte aligned standard-form area whose XSTATE_BV is within XCR0, whose
    // other header bytes are zero and whose MXCSR has supported bits only (checked above:
    // XRSTOR's #GP conditions); components whose bit is clear are initialised.
    unsafe { asm!("xrstor64 [{}]", in(reg) area.as_ptr(), in("eax") u32::MAX, in("edx") u32::MAX, options(nostack)) };
    Ok(())
}

/// `restore_from_signal_frame` by the ring-3 stubs, straight from the frame (through the
/// thread's own area when the frame lacks the alignment XRSTOR or FXRSTOR needs); a fault
/// there (reserved MXCSR bits) refuses the frame.
fn restore_in_ring3(user_address: u64, whole: bool, requested: u64) -> Result<(), BadFpstate> {
    let cpu = tables::current_cpu();
    let (stub, len, alignment) =
        if whole { (STUB_FROM_SIGNAL_FRAME, AREA_SIZE.load(Ordering::Relaxed), 64) } else { (STUB_FROM_LEGACY_FRAME, LEGACY_SIZE, 16) };
    let (mut source, mut own_area) = (user_address, None);
    if !user_address.is_multiple_of(alignment) {
        let slot = LIVE[cpu].load(Ordering::Relaxed).checked_sub(1).ok_or(BadFpstate)?;
        copy_from_user(&mut area_bytes(slot)[..len], user_address)?;
        (source, own_area) = (user_area(slot), Some(slot));
    }
    run_stub(cpu, stub, source, requested, [own_area, None])?;
    Ok(())
}

/// The legacy (FXSAVE) image of the x87 and SSE registers.
#[repr(C, align(16))]
struct LegacyArea([u8; LEGACY_SIZE]);

/// The MXCSR bits this CPU supports, as FXSAVE reports them.
fn mxcsr_mask_of_this_cpu() -> u32 {
    let mut area = LegacyArea([0; LEGACY_SIZE]);
    // SAFETY: the area is 16-byte aligned and 512 bytes long, what FXSAVE writes.
    unsafe { asm!("fxsave64 [{}]", in(reg) area.0.as_mut_ptr(), options(nostack)) };
    match read_u32(&area.0, MXCSR_MASK) {
        0 => 0xffbf, // the architectural default when the CPU reports none
        mask => mask,
    }
}
