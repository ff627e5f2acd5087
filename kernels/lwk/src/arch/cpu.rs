//! Single privileged instructions wrapped as safe functions.

use core::arch::asm;

pub use guest_arch::{inb, outb, outl, read_msr, write_msr};

pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_SFMASK: u32 = 0xc000_0084;
pub const MSR_FS_BASE: u32 = 0xc000_0100;
pub const MSR_GS_BASE: u32 = 0xc000_0101;
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

pub struct CpuidResult {
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

pub fn cpuid(leaf: u32, subleaf: u32) -> CpuidResult {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    CpuidResult { eax: r.eax, ebx: r.ebx, ecx: r.ecx, edx: r.edx }
}

pub fn read_cr2() -> u64 {
    let value: u64;
    // SAFETY: reading CR2 has no side effect.
    unsafe { asm!("mov {}, cr2", out(reg) value, options(nomem, nostack, preserves_flags)) }
    value
}

pub fn read_cr3() -> u64 {
    let value: u64;
    // SAFETY: reading CR3 has no side effect.
    unsafe { asm!("mov {}, cr3", out(reg) value, options(nomem, nostack, preserves_flags)) }
    value
}

pub fn read_tsc() -> u64 {
    // SAFETY: RDTSC is unprivileged and side-effect free.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A 64-bit hardware random number, if the CPU has RDRAND and it delivers.
pub fn rdrand() -> Option<u64> {
    if cpuid(1, 0).ecx & (1 << 30) == 0 {
        return None;
    }
    for _ in 0..10 {
        let value: u64;
        let ok: u8;
        // SAFETY: RDRAND only writes its register operand and CF (checked by CPUID above).
        unsafe { asm!("rdrand {}", "setc {}", out(reg) value, out(reg_byte) ok, options(nomem, nostack)) }
        if ok != 0 {
            return Some(value);
        }
    }
    None
}

/// Turns on what user code expects of the FPU: SSE (OSFXSR, OSXMMEXCPT) and, when the CPU has
/// XSAVE, the user state components in XCR0: all it offers (AVX, AVX-512, so libc picks its
/// fast paths) if `all_components`, else only x87 and SSE, the state FXSAVE can switch between
/// threads (libc then sees AVX as unavailable). The kernel itself is built soft-float and never
/// touches these registers.
pub fn enable_user_fpu(all_components: bool) {
    // SAFETY: sets architectural control bits; only user code uses the FPU state.
    unsafe {
        let mut cr0: u64;
        asm!("mov {}, cr0", out(reg) cr0, options(nomem, nostack));
        cr0 = (cr0 & !(1 << 2)) | (1 << 1); // clear EM, set MP
        asm!("mov cr0, {}", in(reg) cr0, options(nostack));
        let mut cr4: u64;
        asm!("mov {}, cr4", out(reg) cr4, options(nomem, nostack));
        cr4 |= (1 << 9) | (1 << 10); // OSFXSR, OSXMMEXCPT
        let has_xsave = cpuid(1, 0).ecx & (1 << 26) != 0;
        if has_xsave {
            cr4 |= 1 << 18;
        }
        asm!("mov cr4, {}", in(reg) cr4, options(nostack));
        if has_xsave {
            let xcr0 = user_xstate_components(all_components);
            asm!("xsetbv", in("ecx") 0, in("eax") xcr0 as u32, in("edx") (xcr0 >> 32) as u32, options(nomem, nostack));
        }
        asm!("fninit", options(nomem, nostack));
    }
}

/// The XCR0 `enable_user_fpu` sets: x87, SSE, AVX, opmask, ZMM_Hi256 and Hi16_ZMM as far as
/// the CPU has them if `all_components`, else x87 and SSE.
pub fn user_xstate_components(all_components: bool) -> u64 {
    let wanted: u64 = if all_components { 0b1110_0111 } else { 0b11 };
    let supported = cpuid(0xd, 0);
    ((supported.edx as u64) << 32 | supported.eax as u64) & wanted
}

/// Makes sure RDTSC works in user mode (CR4.TSD clear): the vDSO's clocks read the TSC there.
/// Firmware and boot loaders leave TSD clear; a kernel before us might not have.
pub fn allow_user_time_stamp_counter() {
    const TIME_STAMP_DISABLE: u64 = 1 << 2;
    // SAFETY: clearing CR4.TSD only lets user code read the TSC.
    unsafe {
        let cr4: u64;
        asm!("mov {}, cr4", out(reg) cr4, options(nomem, nostack));
        if cr4 & TIME_STAMP_DISABLE != 0 {
            asm!("mov cr4, {}", in(reg) cr4 & !TIME_STAMP_DISABLE, options(nostack));
        }
    }
}

/// Masks every line of both legacy 8259 PICs: firmware leaves them mapped over the exception
/// vectors, and this kernel takes no device interrupts through them.
pub fn mask_legacy_pics() {
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
}

/// Reads a kernel address nothing maps: a deliberate kernel page fault, for the test hook
/// that checks the fault report (`lwk.crash=fault`).
pub fn fault_on_purpose() -> ! {
    const UNMAPPED: u64 = 0xffff_c000_0000_0000;
    // SAFETY: the read faults, and the page-fault handler reports and panics; it never
    // returns here.
    unsafe { core::ptr::read_volatile(UNMAPPED as *const u64) };
    unreachable!("an unmapped kernel address was readable")
}

pub fn halt_forever() -> ! {
    loop {
        // SAFETY: interrupts are off; HLT just stops this vCPU.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
