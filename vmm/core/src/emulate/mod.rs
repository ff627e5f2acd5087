//! Guest kernel instructions PVM cannot emulate, carried out by the VMM.
//!
//! On a PVM host every guest kernel instruction goes through KVM's emulator. It gives up on a few
//! (KVM_EXIT_INTERNAL_ERROR, suberror EMULATION, RIP at the instruction); the VMM then does what
//! the CPU would:
//! - INT3 (and `int $3`), which Linux meets in its boot-time `int3_selftest` and whenever it
//!   patches live text: #BP with the return address after the instruction;
//! - XSAVE and XRSTOR (any memory operand, with or without REX.W), with which Linux switches
//!   the extended state of its threads: the state moves between the guest's area and the vCPU
//!   through KVM_GET_XSAVE/KVM_SET_XSAVE ([`xstate`]); a malformed area gets #GP, an unmapped
//!   page #PF, as from the CPU.
//!
//! On VMX/SVM hosts the guest kernel runs natively and this path is never taken.

mod decode;
mod xstate;

use std::sync::OnceLock;

use kvm_bindings::kvm_xsave;
use kvm_ioctls::{SyncReg, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use decode::{decode, Decoded, Instruction};
use xstate::{Fault, Layout};

/// KVM_INTERNAL_ERROR_EMULATION: KVM's emulator could not carry out the instruction at RIP.
pub const INTERNAL_ERROR_EMULATION: u32 = 1;

const GENERAL_PROTECTION: u8 = 13;
const PAGE_FAULT: u8 = 14;
const PAGE_SIZE: u64 = 0x1000;
/// XCR0, the register XSETBV index 0 names.
const XCR0: u32 = 0;

/// After an emulation failure: carries out the instruction at RIP if it is one `decode` knows,
/// and returns it; `None` leaves the guest untouched (the failure stands).
pub fn carry_out(vcpu: &mut VcpuFd, memory: &GuestMemoryMmap) -> Option<Decoded> {
    // The general registers were synced into kvm_run at the exit (see `run_loop`).
    let regs = vcpu.sync_regs().regs;
    let mut code = [0u8; decode::MAX_LENGTH];
    // An instruction may end on the next page, which may not be mapped: decode what was read.
    let mut fetched = 0;
    while fetched < code.len() {
        let address = regs.rip.wrapping_add(fetched as u64);
        let chunk = (PAGE_SIZE - address % PAGE_SIZE).min((code.len() - fetched) as u64) as usize;
        let Ok(physical) = translate(vcpu, address) else { break };
        memory.read_slice(&mut code[fetched..fetched + chunk], GuestAddress(physical)).ok()?;
        fetched += chunk;
    }
    let decoded = decode(&code[..fetched])?;
    match decoded.instruction {
        // A trap is delivered with RIP after the instruction.
        Instruction::Trap { vector } => {
            Raise { vector, error_code: None, cr2: None }.inject(vcpu)?;
            advance(vcpu, regs.rip, decoded.length);
        }
        Instruction::Xstate { restore, wide, operand } => {
            let address = operand.address(&regs, decoded.length);
            let xcr0 = xcr0(vcpu)?;
            let rfbm = ((regs.rdx << 32) | (regs.rax & 0xffff_ffff)) & xcr0;
            match move_xstate(vcpu, memory, restore, wide, address, rfbm, xcr0)? {
                Ok(()) => advance(vcpu, regs.rip, decoded.length),
                // A fault is delivered with RIP at the instruction.
                Err(fault) => {
                    log::debug!(
                        "{} of the area at {address:#x} (RIP {:#x}) faults: {fault:?}",
                        if restore { "XRSTOR" } else { "XSAVE" },
                        regs.rip
                    );
                    Raise::from(fault).inject(vcpu)?
                }
            }
        }
    }
    Some(decoded)
}

fn advance(vcpu: &mut VcpuFd, rip: u64, length: u64) {
    vcpu.sync_regs_mut().regs.rip = rip.wrapping_add(length);
    vcpu.set_sync_dirty_reg(SyncReg::Register);
}

/// The guest's XCR0 as it set it with XSETBV.
fn xcr0(vcpu: &VcpuFd) -> Option<u64> {
    let xcrs = vcpu.get_xcrs().ok()?;
    xcrs.xcrs[..xcrs.nr_xcrs as usize].iter().find(|xcr| xcr.xcr == XCR0).map(|xcr| xcr.value)
}

/// XSAVE or XRSTOR between the guest area at `address` and the vCPU. The outer `None`: the
/// VMM could not do it (an ioctl failed, or the state does not fit KVM_GET_XSAVE's 4 KiB, which
/// needs KVM_GET_XSAVE2: hosts with AMX); the inner error is the guest's fault.
fn move_xstate(
    vcpu: &VcpuFd,
    memory: &GuestMemoryMmap,
    restore: bool,
    wide: bool,
    address: u64,
    rfbm: u64,
    xcr0: u64,
) -> Option<Result<(), Fault>> {
    static LAYOUT: OnceLock<Layout> = OnceLock::new();
    let layout = LAYOUT.get_or_init(Layout::of_host);
    let mut xsave = vcpu.get_xsave().ok()?;
    let state = region_bytes(&mut xsave);
    if layout.size() > state.len() {
        return None;
    }
    let mut area = GuestArea { vcpu, memory, start: address, cr3: None, translated: Vec::new() };
    let op = xstate::Operation { restore, wide, address, rfbm, xcr0 };
    if let Err(fault) = xstate::execute(op, &mut area, state, layout) {
        return Some(Err(fault));
    }
    if restore {
        // SAFETY: every component the host supports fits the 4 KiB struct (checked above), so
        // KVM reads no further.
        unsafe { vcpu.set_xsave(&xsave) }.ok()?;
    }
    Some(Ok(()))
}

fn region_bytes(xsave: &mut kvm_xsave) -> &mut [u8] {
    // SAFETY: the region is plain data, 4096 bytes of u32 seen as bytes.
    unsafe { std::slice::from_raw_parts_mut(xsave.region.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(&xsave.region)) }
}

/// An exception to deliver to the guest.
struct Raise {
    vector: u8,
    error_code: Option<u32>,
    /// The faulting address of a #PF.
    cr2: Option<u64>,
}

impl From<Fault> for Raise {
    fn from(fault: Fault) -> Raise {
        match fault {
            Fault::GeneralProtection => Raise { vector: GENERAL_PROTECTION, error_code: Some(0), cr2: None },
            Fault::Page { address, error_code } => Raise { vector: PAGE_FAULT, error_code: Some(error_code), cr2: Some(address) },
        }
    }
}

impl Raise {
    fn inject(&self, vcpu: &mut VcpuFd) -> Option<()> {
        if let Some(cr2) = self.cr2 {
            let mut sregs = vcpu.get_sregs().ok()?;
            sregs.cr2 = cr2;
            vcpu.set_sregs(&sregs).ok()?;
        }
        let mut events = vcpu.get_vcpu_events().ok()?;
        events.exception.injected = 1;
        events.exception.nr = self.vector;
        events.exception.has_error_code = self.error_code.is_some() as u8;
        events.exception.error_code = self.error_code.unwrap_or(0);
        vcpu.set_vcpu_events(&events).ok()
    }
}

/// A kernel-mode read's physical address for guest virtual `address`.
fn translate(vcpu: &VcpuFd, address: u64) -> Result<u64, Fault> {
    match vcpu.translate_gva(address) {
        Ok(translation) if translation.valid != 0 => Ok(translation.physical_address),
        _ => Err(Fault::Page { address, error_code: 0 }),
    }
}

/// A guest save area seen through the guest's page tables, page by page.
struct GuestArea<'a> {
    vcpu: &'a VcpuFd,
    memory: &'a GuestMemoryMmap,
    start: u64,
    /// The guest's CR3 and CR4, read on the first write to a user page.
    cr3: Option<(u64, u64)>,
    /// Pages already translated (virtual, physical, checked for writing): the area's parts are
    /// moved one by one, and each translation is an ioctl.
    translated: Vec<(u64, u64, bool)>,
}

/// Page-table entry bits.
const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const LARGE: u64 = 1 << 7;
const ACCESSED_DIRTY: u64 = (1 << 5) | (1 << 6);
const ADDRESS_BITS: u64 = 0x000f_ffff_ffff_f000;
const CR4_LA57: u64 = 1 << 12;
/// #PF error code bits.
const FAULT_PRESENT: u32 = 1 << 0;
const FAULT_WRITE: u32 = 1 << 1;
/// Addresses below this are user space's half.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

impl GuestArea<'_> {
    /// Each page's part of `length` bytes at `offset`: (guest physical address, its range).
    fn pages(&mut self, offset: usize, length: usize, write: bool) -> Result<Vec<(u64, std::ops::Range<usize>)>, Fault> {
        let mut parts = Vec::new();
        let mut done = 0;
        while done < length {
            let address = self.start.wrapping_add((offset + done) as u64);
            let chunk = ((PAGE_SIZE - address % PAGE_SIZE) as usize).min(length - done);
            let (page, within) = (address & !(PAGE_SIZE - 1), address % PAGE_SIZE);
            let checked = write && address < KERNEL_HALF;
            let known = self.translated.iter().find(|&&(virt, _, was_checked)| virt == page && (was_checked || !checked));
            let physical = match known {
                Some(&(_, physical, _)) => physical,
                None => {
                    // The exact address, so that a fault's CR2 is the byte that faulted.
                    let physical = if checked { self.walk_for_write(address)? } else { translate(self.vcpu, address)? } - within;
                    self.translated.push((page, physical, checked));
                    physical
                }
            };
            parts.push((physical + within, done..done + chunk));
            done += chunk;
        }
        Ok(parts)
    }

    /// KVM_TRANSLATE does not say whether a page is writable, and a kernel write to a read-only
    /// user page (a copy-on-write page of a signal frame) must fault, not change the page
    /// another process shares: walks the guest's tables as the CPU does (CR0.WP set, as in
    /// Linux), and sets the leaf's accessed and dirty bits as the CPU would.
    fn walk_for_write(&mut self, address: u64) -> Result<u64, Fault> {
        let not_present = Fault::Page { address, error_code: FAULT_WRITE };
        let (cr3, cr4) = match self.cr3 {
            Some(registers) => registers,
            None => {
                let sregs = self.vcpu.get_sregs().map_err(|_| not_present)?;
                *self.cr3.insert((sregs.cr3, sregs.cr4))
            }
        };
        let mut table = cr3 & ADDRESS_BITS;
        for level in (0..if cr4 & CR4_LA57 != 0 { 5 } else { 4 }).rev() {
            let shift = 12 + 9 * level;
            let slot = GuestAddress(table + ((address >> shift) & 511) * 8);
            let entry: u64 = self.memory.read_obj(slot).map_err(|_| not_present)?;
            if entry & PRESENT == 0 {
                return Err(not_present);
            }
            if entry & WRITABLE == 0 {
                return Err(Fault::Page { address, error_code: FAULT_WRITE | FAULT_PRESENT });
            }
            // Level 2 with PS maps 1 GiB, level 1 2 MiB, level 0 4 KiB.
            if level == 0 || (level <= 2 && entry & LARGE != 0) {
                if entry & ACCESSED_DIRTY != ACCESSED_DIRTY {
                    self.memory.write_obj(entry | ACCESSED_DIRTY, slot).map_err(|_| not_present)?;
                }
                let within = (1u64 << shift) - 1;
                return Ok((entry & ADDRESS_BITS & !within) | (address & within));
            }
            table = entry & ADDRESS_BITS;
        }
        Err(not_present)
    }
}

impl xstate::Area for GuestArea<'_> {
    fn read(&mut self, offset: usize, bytes: &mut [u8]) -> Result<(), Fault> {
        for (physical, range) in self.pages(offset, bytes.len(), false)? {
            let address = self.start.wrapping_add((offset + range.start) as u64);
            self.memory.read_slice(&mut bytes[range], GuestAddress(physical)).map_err(|_| Fault::Page { address, error_code: 0 })?;
        }
        Ok(())
    }

    fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), Fault> {
        for (physical, range) in self.pages(offset, bytes.len(), true)? {
            let address = self.start.wrapping_add((offset + range.start) as u64);
            self.memory.write_slice(&bytes[range], GuestAddress(physical)).map_err(|_| Fault::Page { address, error_code: FAULT_WRITE })?;
        }
        Ok(())
    }
}
