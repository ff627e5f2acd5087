//! User FPU, SSE and AVX state, saved per thread when a CPU switches threads. The kernel is
//! built soft-float and never touches these registers, so they hold the running thread's
//! state whenever the kernel runs; a system call that blocks, or a time slice that ends,
//! must not leak one thread's vector registers into another.

use super::trap::MAX_THREADS;
use core::alloc::Layout;
use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Save areas by thread context slot (null until the slot's first save).
static AREAS: [AtomicU64; MAX_THREADS] = [const { AtomicU64::new(0) }; MAX_THREADS];
static AREA_SIZE: AtomicUsize = AtomicUsize::new(512);
static USE_XSAVE: AtomicBool = AtomicBool::new(false);

/// Whether threads' state is switched with XSAVE (all components) or FXSAVE (x87 and SSE).
/// PVM's emulation of kernel code knows FXSAVE but not XSAVE (the VM stops on it), so under
/// clowder-vmm the kernel uses FXSAVE unless told otherwise (`lwk.fpu=xsave`).
pub fn xsave_wanted(command_line_choice: Option<&str>, under_clowder_vmm: bool) -> bool {
    let has_xsave = super::cpu::cpuid(1, 0).ecx & (1 << 26) != 0;
    has_xsave && command_line_choice.map_or(!under_clowder_vmm, |choice| choice == "xsave")
}

/// Switches threads' state with XSAVE if `use_xsave` (after `enable_user_fpu(true)`), else
/// FXSAVE.
pub fn init(use_xsave: bool) {
    if use_xsave {
        // OSXSAVE: XCR0 is set up; EBX of leaf 0xD is the area size for the enabled components.
        USE_XSAVE.store(true, Ordering::Relaxed);
        AREA_SIZE.store(super::cpu::cpuid(0xd, 0).ebx as usize, Ordering::Relaxed);
    }
}

pub fn uses_xsave() -> bool {
    USE_XSAVE.load(Ordering::Relaxed)
}

fn area(slot: usize) -> u64 {
    let existing = AREAS[slot].load(Ordering::Acquire);
    if existing != 0 {
        return existing;
    }
    let layout = Layout::from_size_align(AREA_SIZE.load(Ordering::Relaxed), 64).expect("FPU area layout");
    // SAFETY: a non-zero size; the area lives as long as the kernel (slots are reused).
    let fresh = unsafe { alloc::alloc::alloc_zeroed(layout) } as u64;
    assert!(fresh != 0, "no memory for an FPU save area");
    AREAS[slot].store(fresh, Ordering::Release);
    fresh
}

/// Saves the registers (the state of the thread in `slot`, or, for a new thread, the state
/// it inherits from its creator).
pub fn save(slot: usize) {
    let area = area(slot);
    // SAFETY: the area is 64-byte aligned and large enough for the enabled components.
    unsafe {
        if USE_XSAVE.load(Ordering::Relaxed) {
            asm!("xsave64 [{}]", in(reg) area, in("eax") u32::MAX, in("edx") u32::MAX, options(nostack));
        } else {
            asm!("fxsave64 [{}]", in(reg) area, options(nostack));
        }
    }
}

/// Loads the state saved for `slot` (nothing if it was never saved: the registers then keep
/// what they hold, as for the first thread).
pub fn restore(slot: usize) {
    let area = AREAS[slot].load(Ordering::Acquire);
    if area == 0 {
        return;
    }
    // SAFETY: the area holds a state saved by `save` with the same instruction.
    unsafe {
        if USE_XSAVE.load(Ordering::Relaxed) {
            asm!("xrstor64 [{}]", in(reg) area, in("eax") u32::MAX, in("edx") u32::MAX, options(nostack));
        } else {
            asm!("fxrstor64 [{}]", in(reg) area, options(nostack));
        }
    }
}

/// The legacy (FXSAVE) image of the x87 and SSE registers: what a signal frame holds as its
/// `fpstate` (Linux's layout without the XSAVE extension).
#[repr(C, align(16))]
pub struct LegacyArea(pub [u8; 512]);

/// The running thread's x87 and SSE registers (the kernel never touches them).
pub fn save_legacy() -> LegacyArea {
    let mut area = LegacyArea([0; 512]);
    // SAFETY: the area is 16-byte aligned and 512 bytes long, what FXSAVE writes.
    unsafe { asm!("fxsave64 [{}]", in(reg) area.0.as_mut_ptr(), options(nostack)) };
    area
}

/// Loads x87 and SSE registers from a legacy image the user may have changed: reserved
/// MXCSR bits, which would fault, are cleared first.
pub fn restore_legacy(mut area: LegacyArea) {
    let mxcsr = u32::from_le_bytes(area.0[24..28].try_into().unwrap()) & supported_mxcsr_bits();
    area.0[24..28].copy_from_slice(&mxcsr.to_le_bytes());
    // SAFETY: a 16-byte aligned 512-byte image with only supported MXCSR bits set; the
    // other fields cannot fault on FXRSTOR.
    unsafe { asm!("fxrstor64 [{}]", in(reg) area.0.as_ptr(), options(nostack)) };
}

/// The MXCSR bits this CPU supports, as FXSAVE reports them (the image's own field may be
/// anything the user wrote).
fn supported_mxcsr_bits() -> u32 {
    let area = save_legacy();
    match u32::from_le_bytes(area.0[28..32].try_into().unwrap()) {
        0 => 0xffbf, // the architectural default when the CPU reports none
        mask => mask,
    }
}
