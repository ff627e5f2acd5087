//! User FPU, SSE and AVX state, saved per thread when a CPU switches threads. The kernel is
//! built soft-float and never touches these registers, so they hold the running thread's
//! state whenever the kernel runs; a system call that blocks, or a time slice that ends,
//! must not leak one thread's vector registers into another.

use super::tables::MAX_CPUS;
use super::trap::{copy_from_user, copy_to_user, UserFault, MAX_THREADS};
use core::alloc::Layout;
use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Save areas by thread context slot (null until the slot's first save), then one scratch
/// area per CPU for signal frames (`SCRATCH_SLOTS`).
static AREAS: [AtomicU64; MAX_THREADS + MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_THREADS + MAX_CPUS];
static AREA_SIZE: AtomicUsize = AtomicUsize::new(512);
static USE_XSAVE: AtomicBool = AtomicBool::new(false);
/// XCR0: the state components XSAVE switches (with XSAVE only).
static COMPONENTS: AtomicU64 = AtomicU64::new(0b11);
const SCRATCH_SLOTS: usize = MAX_THREADS;
/// The MXCSR bits the CPU supports (read once: an FXSAVE is costly emulated work on PVM).
static SUPPORTED_MXCSR: AtomicU32 = AtomicU32::new(0xffbf);

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
    SUPPORTED_MXCSR.store(mxcsr_mask_of_this_cpu(), Ordering::Relaxed);
    if use_xsave {
        // OSXSAVE: XCR0 is set up; EBX of leaf 0xD is the area size for the enabled components.
        USE_XSAVE.store(true, Ordering::Relaxed);
        AREA_SIZE.store(super::cpu::cpuid(0xd, 0).ebx as usize, Ordering::Relaxed);
        let (low, high): (u32, u32);
        // SAFETY: XGETBV 0 reads XCR0; OSXSAVE is on (`enable_user_fpu`).
        unsafe { asm!("xgetbv", in("ecx") 0, out("eax") low, out("edx") high, options(nomem, nostack)) };
        COMPONENTS.store((high as u64) << 32 | low as u64, Ordering::Relaxed);
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

/// The legacy (FXSAVE) image of the x87 and SSE registers, followed by the XSAVE header.
#[repr(C, align(64))]
struct InitialImage([u8; XSAVE_HEADER + 64]);

/// Offsets in an FXSAVE image / XSAVE area.
const FCW: usize = 0;
const MXCSR: usize = 24;
const MXCSR_MASK: usize = 28;
const LEGACY_SIZE: usize = 512;
/// Linux's `struct _fpx_sw_bytes` in the image's unused tail: magic1, extended size,
/// components, XSAVE area size.
const SW_BYTES: usize = 464;
const XSAVE_HEADER: usize = 512;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
const MAGIC2_SIZE: usize = 4;
const X87_AND_SSE: u64 = 0b11;

/// What a signal handler starts with, as on Linux: x87 and SSE at their reset values (FCW
/// 0x37f, MXCSR 0x1f80, registers zero), every other component in its initial state (its
/// XSTATE_BV bit clear).
static INITIAL: InitialImage = {
    let mut image = [0u8; XSAVE_HEADER + 64];
    image[FCW] = 0x7f;
    image[FCW + 1] = 0x03;
    image[MXCSR] = 0x80;
    image[MXCSR + 1] = 0x1f;
    image[XSAVE_HEADER] = X87_AND_SSE as u8;
    InitialImage(image)
};

/// Whether a signal frame's `fpstate` is the XSAVE area (`UC_FP_XSTATE` in `uc_flags`).
pub fn signal_frame_has_xstate() -> bool {
    USE_XSAVE.load(Ordering::Relaxed)
}

/// Bytes of `fpstate` in a signal frame: Linux's layout, the XSAVE area (standard form)
/// followed by FP_XSTATE_MAGIC2 with XSAVE, the 512-byte legacy image with FXSAVE.
pub fn signal_frame_size() -> u64 {
    if USE_XSAVE.load(Ordering::Relaxed) {
        (AREA_SIZE.load(Ordering::Relaxed) + MAGIC2_SIZE) as u64
    } else {
        LEGACY_SIZE as u64
    }
}

/// This CPU's scratch area for signal frames. The kernel runs with interrupts off, so
/// nothing else on this CPU uses it meanwhile.
fn scratch() -> &'static mut [u8] {
    let size = AREA_SIZE.load(Ordering::Relaxed);
    let area = area(SCRATCH_SLOTS + super::tables::current_cpu());
    // SAFETY: the area is `size` bytes, lives for good and is used by this CPU only, one
    // borrow at a time (callers drop it before returning).
    unsafe { core::slice::from_raw_parts_mut(area as *mut u8, size) }
}

fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

fn write_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

/// Writes the running thread's vector registers into a signal frame's `fpstate` at
/// `user_address` (`signal_frame_size` bytes, 64-byte aligned), then gives the registers
/// their initial values for the handler.
pub fn save_to_signal_frame(user_address: u64) -> Result<(), UserFault> {
    if USE_XSAVE.load(Ordering::Relaxed) {
        let area = scratch();
        let size = area.len();
        // Components in their initial state are not written: clear what another frame left.
        area.fill(0);
        // SAFETY: the area is 64-byte aligned and large enough for the enabled components.
        unsafe { asm!("xsave64 [{}]", in(reg) area.as_mut_ptr(), in("eax") u32::MAX, in("edx") u32::MAX, options(nostack)) };
        // As Linux: x87 and SSE always present (FXRSTOR-compatible), then the software bytes.
        area[XSAVE_HEADER] |= X87_AND_SSE as u8;
        write_u32(area, SW_BYTES, FP_XSTATE_MAGIC1);
        write_u32(area, SW_BYTES + 4, (size + MAGIC2_SIZE) as u32);
        area[SW_BYTES + 8..SW_BYTES + 16].copy_from_slice(&COMPONENTS.load(Ordering::Relaxed).to_le_bytes());
        write_u32(area, SW_BYTES + 16, size as u32);
        copy_to_user(user_address, area)?;
        copy_to_user(user_address + size as u64, &FP_XSTATE_MAGIC2.to_le_bytes())?;
    } else {
        let mut area = LegacyArea([0; LEGACY_SIZE]);
        // SAFETY: the area is 16-byte aligned and 512 bytes long, what FXSAVE writes.
        unsafe { asm!("fxsave64 [{}]", in(reg) area.0.as_mut_ptr(), options(nostack)) };
        copy_to_user(user_address, &area.0)?;
    }
    load_initial_state();
    Ok(())
}

/// The initial x87/SSE/AVX state (`INITIAL`), as a signal handler gets it.
pub fn load_initial_state() {
    // SAFETY: a valid image: reset FCW and MXCSR, a header naming only x87 and SSE.
    unsafe {
        if USE_XSAVE.load(Ordering::Relaxed) {
            asm!("xrstor64 [{}]", in(reg) INITIAL.0.as_ptr(), in("eax") u32::MAX, in("edx") u32::MAX, options(nostack));
        } else {
            asm!("fxrstor64 [{}]", in(reg) INITIAL.0.as_ptr(), options(nostack));
        }
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
/// the frame when XRSTOR faults.
pub fn restore_from_signal_frame(user_address: u64) -> Result<(), BadFpstate> {
    if !USE_XSAVE.load(Ordering::Relaxed) {
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
    let area = scratch();
    let size = area.len();
    copy_from_user(&mut area[..LEGACY_SIZE], user_address)?;
    if read_u32(area, MXCSR) & !SUPPORTED_MXCSR.load(Ordering::Relaxed) != 0 {
        return Err(BadFpstate);
    }
    let mut magic2 = [0u8; MAGIC2_SIZE];
    let whole = read_u32(area, SW_BYTES) == FP_XSTATE_MAGIC1
        && read_u32(area, SW_BYTES + 4) as usize == size + MAGIC2_SIZE
        && read_u32(area, SW_BYTES + 16) as usize == size
        && copy_from_user(&mut magic2, user_address + size as u64).is_ok()
        && u32::from_le_bytes(magic2) == FP_XSTATE_MAGIC2;
    let requested = if whole {
        copy_from_user(&mut area[LEGACY_SIZE..], user_address + LEGACY_SIZE as u64)?;
        let header = &area[XSAVE_HEADER..XSAVE_HEADER + 64];
        let present = u64::from_le_bytes(header[..8].try_into().unwrap());
        if present & !COMPONENTS.load(Ordering::Relaxed) != 0 || header[8..].iter().any(|&byte| byte != 0) {
            return Err(BadFpstate);
        }
        u64::from_le_bytes(area[SW_BYTES + 8..SW_BYTES + 16].try_into().unwrap())
    } else {
        // A legacy image: the header is not the user's; x87 and SSE from the image.
        area[XSAVE_HEADER..XSAVE_HEADER + 64].fill(0);
        area[XSAVE_HEADER] = X87_AND_SSE as u8;
        X87_AND_SSE
    };
    // Components the frame does not name start over (their XSTATE_BV bit cleared), as Linux
    // initialises them.
    let present = u64::from_le_bytes(area[XSAVE_HEADER..XSAVE_HEADER + 8].try_into().unwrap()) & requested;
    area[XSAVE_HEADER..XSAVE_HEADER + 8].copy_from_slice(&present.to_le_bytes());
    // SAFETY: a 64-byte aligned standard-form area whose XSTATE_BV is within XCR0, whose
    // other header bytes are zero and whose MXCSR has supported bits only (checked above:
    // XRSTOR's #GP conditions); components whose bit is clear are initialised.
    unsafe { asm!("xrstor64 [{}]", in(reg) area.as_ptr(), in("eax") u32::MAX, in("edx") u32::MAX, options(nostack)) };
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
