//! `test=xsave [count=N]`: XRSTOR and XSAVE of x87, SSE and AVX state in ring 0 (on PVM the
//! VMM carries them out, vmm/core/src/emulate): an area with known XMM and upper YMM halves
//! restored and saved again must come back the same; N more pairs are timed (TSC cycles); then an XRSTOR of
//! a misaligned area raises #GP at its own address.

use core::arch::{asm, global_asm};

use crate::hypercall::{exit, report};
use crate::{arch, println, Boot, EXIT_FAIL, EXIT_PASS};

const X87_SSE_AVX: u32 = 0b111;
const CPUID_XSAVE: u32 = 1 << 26;
const CPUID_AVX: u32 = 1 << 28;
const CR4_OSXSAVE: u64 = 1 << 18;
const XMM: core::ops::Range<usize> = 160..416;
const HEADER: usize = 512;

#[repr(C, align(64))]
struct Area([u8; 4096]);

static mut LOADED: Area = Area([0; 4096]);
static mut SAVED: Area = Area([0; 4096]);

// `xrstor64 [rdi]` at a known address, so the test can expect #GP there.
global_asm!(".pushsection .text", ".global xrstor_site", "xrstor_site:", "xrstor64 [rdi]", "ud2", ".popsection");
extern "C" {
    fn xrstor_site();
}

/// XRSTOR64 (`restore`) or XSAVE64 of x87, SSE and AVX at `area`.
fn xstate(restore: bool, area: *mut Area) {
    // SAFETY: the area is 64-byte aligned, large enough for these components, and ours.
    unsafe {
        if restore {
            asm!("xrstor64 [{}]", in(reg) area, in("eax") X87_SSE_AVX, in("edx") 0, options(nostack));
        } else {
            asm!("xsave64 [{}]", in(reg) area, in("eax") X87_SSE_AVX, in("edx") 0, options(nostack));
        }
    }
}

pub fn xsave(boot: &Boot) -> ! {
    let [_, _, features, _] = arch::cpuid(1);
    if features & (CPUID_XSAVE | CPUID_AVX) != CPUID_XSAVE | CPUID_AVX {
        println!("xsave: the CPU offers no XSAVE or no AVX");
        report(b"noavx", 1);
        exit(EXIT_PASS)
    }
    // SAFETY: enables XSAVE and sets XCR0 to components the CPU has (checked above).
    unsafe {
        asm!("mov {t}, cr4", "or {t}, {bit}", "mov cr4, {t}", t = out(reg) _, bit = in(reg) CR4_OSXSAVE, options(nostack));
        asm!("xsetbv", in("ecx") 0, in("eax") X87_SSE_AVX, in("edx") 0, options(nostack));
    }
    // AVX's upper YMM halves: where leaf 0xD sub-leaf 2 puts them, 256 bytes.
    let avx = arch::cpuid_count(0xd, 2)[1] as usize..arch::cpuid_count(0xd, 2)[1] as usize + 256;
    let (loaded, saved) = (&raw mut LOADED, &raw mut SAVED);
    // SAFETY: one vCPU runs this test; nothing else touches the areas.
    let kept = unsafe {
        let bytes = &mut (*loaded).0;
        bytes[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
        bytes[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
        for (i, byte) in bytes[XMM].iter_mut().enumerate() {
            *byte = i as u8 | 1;
        }
        for (i, byte) in bytes[avx.clone()].iter_mut().enumerate() {
            *byte = 0x80 | i as u8;
        }
        bytes[HEADER] = X87_SSE_AVX as u8;
        xstate(true, loaded);
        xstate(false, saved);
        let (before, after) = (&(*loaded).0, &(*saved).0);
        before[XMM] == after[XMM] && before[avx.clone()] == after[avx] && after[HEADER] & 0b110 == 0b110 && after[0..2] == before[0..2]
    };
    report(b"kept", kept as u64);
    if !kept {
        exit(EXIT_FAIL)
    }
    let count = boot.cmdline.number("count").unwrap_or(0);
    // SAFETY: RDTSC only reads the time-stamp counter.
    let started = unsafe { core::arch::x86_64::_rdtsc() };
    for _ in 0..count {
        xstate(false, saved);
        xstate(true, saved);
    }
    // SAFETY: as above.
    report(b"cycles", unsafe { core::arch::x86_64::_rdtsc() } - started);
    report(b"pairs", count);
    report(b"gpat", xrstor_site as *const () as u64);
    // SAFETY: the site faults (#GP: misaligned area) and the exception stub ends the test.
    unsafe {
        asm!("call {site}", site = sym xrstor_site, in("rdi") loaded.cast::<u8>().add(16), in("eax") X87_SSE_AVX, in("edx") 0, options(noreturn));
    }
}
