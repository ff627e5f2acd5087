//! XSAVE and XRSTOR (standard form) between a guest's save area and the vCPU's extended state
//! as KVM_GET_XSAVE/KVM_SET_XSAVE hold it, which is the same standard layout (pure: the area
//! is a trait, so tests use a byte vector).
//!
//! What the CPU does (Intel SDM vol. 1, 13.7-13.8), for the requested-feature bitmap
//! RFBM = EDX:EAX & XCR0: XSAVE writes each component in RFBM and sets XSTATE_BV's RFBM bits
//! to whether the component is in use, leaving the rest of the area alone; XRSTOR loads each
//! component in RFBM whose XSTATE_BV bit is set and initialises those whose bit is clear. A
//! misaligned area, XSTATE_BV bits outside XCR0, a compacted or otherwise nonzero rest of the
//! header, or reserved MXCSR bits raise #GP. The compacted form is refused with #GP, as on a
//! CPU without XSAVEC (the guest is told it has none).

/// x87 state (component 0), SSE (1) and AVX (2): the three that MXCSR goes with.
const X87: u64 = 1 << 0;
const SSE: u64 = 1 << 1;
const AVX: u64 = 1 << 2;

/// Offsets in the legacy region (the FXSAVE image) and the header.
const FPU_IP_HIGH: std::ops::Range<usize> = 12..16;
const FPU_DP_HIGH: std::ops::Range<usize> = 20..24;
const FPU_CONTROL: std::ops::Range<usize> = 0..24;
const MXCSR: std::ops::Range<usize> = 24..28;
const MXCSR_AND_MASK: std::ops::Range<usize> = 24..32;
const MXCSR_MASK: std::ops::Range<usize> = 28..32;
const FPU_REGISTERS: std::ops::Range<usize> = 32..160;
const XMM_REGISTERS: std::ops::Range<usize> = 160..416;
const HEADER: usize = 512;
const HEADER_SIZE: usize = 64;
/// MXCSR's writable bits when the area's MXCSR_MASK is zero (SDM 11.6.6).
const DEFAULT_MXCSR_MASK: u32 = 0xffbf;
/// The area must be aligned to 64 bytes.
pub const ALIGNMENT: u64 = 64;

/// Why the instruction faults instead of completing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    GeneralProtection,
    /// A page of the area is not mapped (or not writable for XSAVE): the guest gets #PF.
    Page {
        address: u64,
        error_code: u32,
    },
}

/// Where the components above SSE lie in the standard layout (CPUID leaf 0xD sub-leaf i:
/// EBX offset, EAX size), as KVM's buffers and the guest's areas both use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// (component, offset, size), components 2 and up.
    pub components: Vec<(u32, usize, usize)>,
}

impl Layout {
    /// The host CPU's layout for the user components it supports (leaf 0xD sub-leaf 0, EDX:EAX).
    pub fn of_host() -> Layout {
        let leaf = std::arch::x86_64::__cpuid_count(0xd, 0);
        let supported = (leaf.edx as u64) << 32 | leaf.eax as u64;
        let components = (2..63)
            .filter(|bit| supported & (1 << bit) != 0)
            .map(|bit| {
                let leaf = std::arch::x86_64::__cpuid_count(0xd, bit);
                (bit, leaf.ebx as usize, leaf.eax as usize)
            })
            .collect();
        Layout { components }
    }

    /// The bytes from the area's start to the end of the last component.
    pub fn size(&self) -> usize {
        self.components.iter().map(|&(_, offset, size)| offset + size).max().unwrap_or(0).max(HEADER + HEADER_SIZE)
    }
}

/// One XSAVE (`restore` false) or XRSTOR: `wide` is the REX.W form, `address` the area's,
/// `rfbm` the components requested (EDX:EAX & XCR0).
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    pub restore: bool,
    pub wide: bool,
    pub address: u64,
    pub rfbm: u64,
    pub xcr0: u64,
}

/// A guest's save area, by offset from its start.
pub trait Area {
    fn read(&mut self, offset: usize, bytes: &mut [u8]) -> Result<(), Fault>;
    fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), Fault>;
}

/// `op` between the guest's area and `state` (a KVM_GET_XSAVE image of at least
/// `layout.size()` bytes, changed in place by XRSTOR and then to be given to KVM_SET_XSAVE).
pub fn execute(op: Operation, area: &mut impl Area, state: &mut [u8], layout: &Layout) -> Result<(), Fault> {
    if op.address % ALIGNMENT != 0 {
        return Err(Fault::GeneralProtection);
    }
    if op.restore {
        xrstor(area, state, op.rfbm, op.xcr0, op.wide, layout)
    } else {
        xsave(area, state, op.rfbm, op.wide, layout)
    }
}

/// The byte ranges of each component in `rfbm` (x87 without MXCSR, which goes with SSE and AVX).
fn ranges(rfbm: u64, layout: &Layout) -> Vec<(u64, Vec<std::ops::Range<usize>>)> {
    let mut ranges = vec![(X87, vec![FPU_CONTROL, FPU_REGISTERS]), (SSE, vec![XMM_REGISTERS])];
    ranges.extend(layout.components.iter().map(|&(bit, offset, size)| (1u64 << bit, std::iter::once(offset..offset + size).collect())));
    ranges.retain(|(bit, _)| rfbm & bit != 0);
    ranges
}

fn xstate_bv(image: &[u8]) -> u64 {
    u64::from_le_bytes(image[HEADER..HEADER + 8].try_into().unwrap())
}

/// Without REX.W the x87 pointers are 32-bit offsets each followed by a selector, which this
/// CPU no longer keeps (CPUID.7.EBX[13] on current CPUs: stored as zero).
fn narrow_pointers(legacy: &mut [u8]) {
    legacy[FPU_IP_HIGH].fill(0);
    legacy[FPU_DP_HIGH].fill(0);
}

fn xsave(area: &mut impl Area, state: &[u8], rfbm: u64, wide: bool, layout: &Layout) -> Result<(), Fault> {
    for (bit, ranges) in ranges(rfbm, layout) {
        for range in ranges {
            if bit == X87 && range == FPU_CONTROL && !wide {
                let mut control = state[FPU_CONTROL].to_vec();
                narrow_pointers(&mut control);
                area.write(range.start, &control)?;
            } else {
                area.write(range.start, &state[range])?;
            }
        }
    }
    if rfbm & (SSE | AVX) != 0 {
        area.write(MXCSR_AND_MASK.start, &state[MXCSR_AND_MASK])?;
    }
    let mut old = [0u8; 8];
    area.read(HEADER, &mut old)?;
    let bv = (u64::from_le_bytes(old) & !rfbm) | (xstate_bv(state) & rfbm);
    area.write(HEADER, &bv.to_le_bytes())
}

fn xrstor(area: &mut impl Area, state: &mut [u8], rfbm: u64, xcr0: u64, wide: bool, layout: &Layout) -> Result<(), Fault> {
    let mut header = [0u8; HEADER_SIZE];
    area.read(HEADER, &mut header)?;
    let bv = u64::from_le_bytes(header[..8].try_into().unwrap());
    // XCOMP_BV and the reserved bytes: zero in the standard form; bit 63 (compacted) needs XSAVEC.
    if bv & !xcr0 != 0 || header[8..].iter().any(|&byte| byte != 0) {
        return Err(Fault::GeneralProtection);
    }
    // Everything is read and checked before the state changes, so a fault leaves it as it was.
    let mut loaded = Vec::new();
    for (bit, ranges) in ranges(rfbm & bv, layout) {
        for range in ranges {
            let mut bytes = vec![0u8; range.len()];
            area.read(range.start, &mut bytes)?;
            if bit == X87 && range == FPU_CONTROL && !wide {
                narrow_pointers(&mut bytes);
            }
            loaded.push((range, bytes));
        }
    }
    let mxcsr = if rfbm & (SSE | AVX) != 0 {
        let mut bytes = [0u8; 4];
        area.read(MXCSR.start, &mut bytes)?;
        let mask = match u32::from_le_bytes(state[MXCSR_MASK].try_into().unwrap()) {
            0 => DEFAULT_MXCSR_MASK,
            mask => mask,
        };
        if u32::from_le_bytes(bytes) & !mask != 0 {
            return Err(Fault::GeneralProtection);
        }
        Some(bytes)
    } else {
        None
    };
    for (range, bytes) in loaded {
        state[range].copy_from_slice(&bytes);
    }
    // KVM_SET_XSAVE initialises each component whose XSTATE_BV bit is clear.
    let mut state_bv = (xstate_bv(state) & !rfbm) | (bv & rfbm);
    if let Some(mxcsr) = mxcsr {
        state[MXCSR].copy_from_slice(&mxcsr);
        // KVM takes MXCSR only with x87, SSE or AVX marked in use; the CPU loads it whatever
        // XSTATE_BV says. SSE in use with zero XMM registers is SSE's init state, plus MXCSR.
        if state_bv & (X87 | SSE | AVX) == 0 {
            state[XMM_REGISTERS].fill(0);
            state_bv |= SSE;
        }
    }
    state[HEADER..HEADER + 8].copy_from_slice(&state_bv.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AVX (256 bytes at 576), opmask (64 at 1088), ZMM_Hi256 (512 at 1152), Hi16_ZMM (1024
    /// at 1664): an AVX-512 CPU's layout.
    fn layout() -> Layout {
        Layout { components: vec![(2, 576, 256), (5, 1088, 64), (6, 1152, 512), (7, 1664, 1024)] }
    }

    const ALL: u64 = 0xe7;

    /// XRSTOR (`restore`) or XSAVE with XCR0 = every component of [`layout`].
    fn op(restore: bool, wide: bool, address: u64, rfbm: u64) -> Operation {
        Operation { restore, wide, address, rfbm, xcr0: ALL }
    }

    /// A guest area in a byte vector; offsets past `faults_from` fault as an unmapped page.
    struct Fake {
        bytes: Vec<u8>,
        faults_from: usize,
    }

    impl Fake {
        fn new(fill: u8) -> Fake {
            Fake { bytes: vec![fill; 4096], faults_from: usize::MAX }
        }
        fn check(&self, offset: usize, length: usize) -> Result<(), Fault> {
            match offset + length > self.faults_from {
                true => Err(Fault::Page { address: 0x7000_0000 + self.faults_from as u64, error_code: 2 }),
                false => Ok(()),
            }
        }
        fn bv(&self) -> u64 {
            xstate_bv(&self.bytes)
        }
    }

    impl Area for Fake {
        fn read(&mut self, offset: usize, bytes: &mut [u8]) -> Result<(), Fault> {
            self.check(offset, bytes.len())?;
            bytes.copy_from_slice(&self.bytes[offset..offset + bytes.len()]);
            Ok(())
        }
        fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), Fault> {
            self.check(offset, bytes.len())?;
            self.bytes[offset..offset + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
    }

    /// A vCPU's state with every byte of component i's ranges set to 0x10 + i, all in use.
    fn state() -> Vec<u8> {
        let mut state = vec![0u8; 4096];
        for (bit, ranges) in ranges(ALL, &layout()) {
            for range in ranges {
                state[range].fill(0x10 + bit.trailing_zeros() as u8);
            }
        }
        state[MXCSR].copy_from_slice(&0x1f80u32.to_le_bytes());
        state[MXCSR_MASK].copy_from_slice(&0xffffu32.to_le_bytes());
        state[HEADER..HEADER + 8].copy_from_slice(&ALL.to_le_bytes());
        state
    }

    fn header_bv(area: &mut Fake, bv: u64) {
        area.bytes[HEADER..HEADER + HEADER_SIZE].fill(0);
        area.bytes[HEADER..HEADER + 8].copy_from_slice(&bv.to_le_bytes());
    }

    #[test]
    fn xsave_writes_the_requested_components_and_only_them() {
        let mut area = Fake::new(0xaa);
        header_bv(&mut area, 1 << 9);
        // RFBM: x87, SSE, opmask: not AVX and the ZMM parts.
        execute(op(false, true, 0x1000, X87 | SSE | (1 << 5)), &mut area, &mut state(), &layout()).unwrap();
        assert!(area.bytes[0..24].iter().all(|&b| b == 0x10));
        assert_eq!(&area.bytes[24..28], &0x1f80u32.to_le_bytes(), "MXCSR with SSE");
        assert!(area.bytes[32..160].iter().all(|&b| b == 0x10));
        assert!(area.bytes[160..416].iter().all(|&b| b == 0x11));
        assert!(area.bytes[416..512].iter().all(|&b| b == 0xaa), "the reserved and software bytes stay");
        assert!(area.bytes[576..832].iter().all(|&b| b == 0xaa), "AVX not requested");
        assert!(area.bytes[1088..1152].iter().all(|&b| b == 0x15));
        assert!(area.bytes[1152..].iter().all(|&b| b == 0xaa), "ZMM not requested");
        assert_eq!(area.bv(), (1 << 9) | X87 | SSE | (1 << 5), "other XSTATE_BV bits kept");
        assert!(area.bytes[HEADER + 8..HEADER + 64].iter().all(|&b| b == 0), "rest of the header untouched");
    }

    #[test]
    fn xsave_marks_components_in_init_state_as_not_in_use() {
        let mut area = Fake::new(0);
        let mut vcpu = state();
        vcpu[HEADER..HEADER + 8].copy_from_slice(&(X87 | SSE).to_le_bytes());
        execute(op(false, true, 0, ALL), &mut area, &mut vcpu, &layout()).unwrap();
        assert_eq!(area.bv(), X87 | SSE);
    }

    #[test]
    fn xsave_without_rex_w_stores_32_bit_pointers() {
        let mut area = Fake::new(0);
        execute(op(false, false, 0, X87), &mut area, &mut state(), &layout()).unwrap();
        assert_eq!(&area.bytes[8..16], &[0x10, 0x10, 0x10, 0x10, 0, 0, 0, 0]);
        assert_eq!(&area.bytes[24..32], &[0; 8], "no MXCSR without SSE or AVX");
    }

    #[test]
    fn xrstor_loads_set_components_and_initialises_clear_ones() {
        let mut area = Fake::new(0x77);
        header_bv(&mut area, X87 | SSE | (1 << 6));
        area.bytes[24..28].copy_from_slice(&0x9fc0u32.to_le_bytes());
        let mut vcpu = state();
        execute(op(true, true, 0x40, ALL), &mut area, &mut vcpu, &layout()).unwrap();
        assert_eq!(xstate_bv(&vcpu), X87 | SSE | (1 << 6), "AVX, opmask, Hi16_ZMM to their init state");
        assert!(vcpu[0..24].iter().all(|&b| b == 0x77));
        assert_eq!(&vcpu[24..28], &0x9fc0u32.to_le_bytes());
        assert_eq!(&vcpu[28..32], &0xffffu32.to_le_bytes(), "MXCSR_MASK is not loaded");
        assert!(vcpu[160..416].iter().all(|&b| b == 0x77));
        assert!(vcpu[1152..1664].iter().all(|&b| b == 0x77));
        assert!(vcpu[576..832].iter().all(|&b| b == 0x12), "not loaded: KVM initialises it by its bit");
    }

    #[test]
    fn xrstor_leaves_components_outside_rfbm_alone() {
        let mut area = Fake::new(0x77);
        header_bv(&mut area, 0);
        area.bytes[24..28].copy_from_slice(&0x1f81u32.to_le_bytes());
        let mut vcpu = state();
        execute(op(true, true, 0, AVX | (1 << 7)), &mut area, &mut vcpu, &layout()).unwrap();
        assert_eq!(xstate_bv(&vcpu), ALL & !((1 << 7) | AVX) | SSE, "AVX and Hi16_ZMM initialised, the rest kept");
        assert!(vcpu[0..24].iter().all(|&b| b == 0x10));
        assert_eq!(&vcpu[24..28], &0x1f81u32.to_le_bytes(), "MXCSR loaded with AVX requested");
    }

    #[test]
    fn xrstor_of_an_init_area_still_loads_mxcsr() {
        // Linux's init_fpstate: XSTATE_BV 0, MXCSR 0x1f80 (what exec restores).
        let mut area = Fake::new(0);
        area.bytes[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
        let mut vcpu = state();
        vcpu[24..28].copy_from_slice(&0x7f80u32.to_le_bytes());
        execute(op(true, true, 0, ALL), &mut area, &mut vcpu, &layout()).unwrap();
        assert_eq!(&vcpu[24..28], &0x1f80u32.to_le_bytes());
        assert_eq!(xstate_bv(&vcpu), SSE, "SSE in use with zero registers carries MXCSR to KVM");
        assert!(vcpu[160..416].iter().all(|&b| b == 0));
    }

    #[test]
    fn malformed_areas_raise_general_protection_and_change_nothing() {
        type Spoil = fn(&mut Fake);
        let cases: [(&str, u64, Spoil); 5] = [
            ("misaligned", 0x20, |_| {}),
            ("XSTATE_BV outside XCR0", 0, |area| header_bv(area, 1 << 9)),
            ("compacted", 0, |area| area.bytes[HEADER + 15] = 0x80),
            ("reserved header byte", 0, |area| area.bytes[HEADER + 63] = 1),
            ("reserved MXCSR bit", 0, |area| area.bytes[24..28].copy_from_slice(&0x1_0000u32.to_le_bytes())),
        ];
        for (what, address, spoil) in cases {
            let mut area = Fake::new(0);
            header_bv(&mut area, X87);
            spoil(&mut area);
            let mut vcpu = state();
            let before = vcpu.clone();
            assert_eq!(execute(op(true, true, address, ALL), &mut area, &mut vcpu, &layout()), Err(Fault::GeneralProtection), "{what}");
            assert!(vcpu == before, "{what}: state changed");
        }
        let mut area = Fake::new(0);
        assert_eq!(execute(op(false, true, 8, ALL), &mut area, &mut state(), &layout()), Err(Fault::GeneralProtection));
        assert!(area.bytes.iter().all(|&b| b == 0), "a misaligned XSAVE writes nothing");
    }

    #[test]
    fn page_faults_are_passed_on() {
        let mut area = Fake::new(0);
        area.faults_from = 2048;
        let fault = Fault::Page { address: 0x7000_0800, error_code: 2 };
        assert_eq!(execute(op(false, true, 0, ALL), &mut area, &mut state(), &layout()), Err(fault));
        let mut vcpu = state();
        let before = vcpu.clone();
        header_bv(&mut area, ALL);
        assert_eq!(execute(op(true, true, 0, ALL), &mut area, &mut vcpu, &layout()), Err(fault));
        assert!(vcpu == before);
    }

    #[test]
    fn layout_size_covers_the_last_component() {
        assert_eq!(layout().size(), 2688);
        assert_eq!(Layout { components: vec![] }.size(), 576);
    }
}
