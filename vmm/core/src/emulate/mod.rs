//! Guest kernel instructions PVM cannot emulate, carried out by the VMM.
//!
//! On a PVM host every guest kernel instruction goes through KVM's emulator. It gives up on a few
//! (KVM_EXIT_INTERNAL_ERROR, suberror EMULATION, RIP at the instruction); Linux meets INT3 in its
//! boot-time `int3_selftest` and whenever it patches live text. The VMM does what the CPU would:
//! INT3 (and `int $3`) raise #BP with the return address after the instruction. On VMX/SVM
//! hosts the guest kernel runs natively and this path is never taken.

use kvm_ioctls::{SyncReg, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// KVM_INTERNAL_ERROR_EMULATION: KVM's emulator could not carry out the instruction at RIP.
pub const INTERNAL_ERROR_EMULATION: u32 = 1;

/// An exception the instruction raises, and how far RIP moves before it is delivered (a trap
/// such as #BP reports the address of the next instruction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trap {
    pub vector: u8,
    pub length: u64,
}

const BREAKPOINT: u8 = 3;

/// The trap the instruction starting at `code` raises, if it is one the VMM carries out.
pub fn decode(code: &[u8]) -> Option<Trap> {
    match code {
        [0xcc, ..] => Some(Trap { vector: BREAKPOINT, length: 1 }),
        [0xcd, 0x03, ..] => Some(Trap { vector: BREAKPOINT, length: 2 }),
        _ => None,
    }
}

/// After an emulation failure: carries out the instruction at RIP if it is one `decode` knows,
/// and returns it; `None` leaves the guest untouched (the failure stands).
pub fn carry_out(vcpu: &mut VcpuFd, memory: &GuestMemoryMmap) -> Option<Trap> {
    // The general registers were synced into kvm_run at the exit (see `run_loop`).
    let rip = vcpu.sync_regs().regs.rip;
    let translation = vcpu.translate_gva(rip).ok().filter(|t| t.valid != 0)?;
    let mut code = [0u8; 2];
    // An instruction may end on the next page; the longest one decoded is two bytes.
    let first = 0x1000 - (translation.physical_address & 0xfff) as usize;
    let first = first.min(code.len());
    memory.read_slice(&mut code[..first], GuestAddress(translation.physical_address)).ok()?;
    if first < code.len() {
        let next = vcpu.translate_gva(rip + first as u64).ok().filter(|t| t.valid != 0);
        if let Some(next) = next {
            memory.read_slice(&mut code[first..], GuestAddress(next.physical_address)).ok()?;
        }
    }
    let trap = decode(&code)?;
    let mut events = vcpu.get_vcpu_events().ok()?;
    events.exception.injected = 1;
    events.exception.nr = trap.vector;
    events.exception.has_error_code = 0;
    events.exception.error_code = 0;
    vcpu.set_vcpu_events(&events).ok()?;
    vcpu.sync_regs_mut().regs.rip = rip.wrapping_add(trap.length);
    vcpu.set_sync_dirty_reg(SyncReg::Register);
    Some(trap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int3_traps_past_its_one_byte() {
        assert_eq!(decode(&[0xcc, 0x90]), Some(Trap { vector: 3, length: 1 }));
        assert_eq!(decode(&[0xcc]), Some(Trap { vector: 3, length: 1 }));
    }

    #[test]
    fn int_3_traps_past_its_two_bytes() {
        assert_eq!(decode(&[0xcd, 0x03]), Some(Trap { vector: 3, length: 2 }));
    }

    #[test]
    fn other_instructions_are_left_to_fail() {
        assert_eq!(decode(&[0xcd, 0x80]), None, "int $0x80 is not carried out");
        assert_eq!(decode(&[0x0f, 0xc7, 0x0e]), None, "cmpxchg16b");
        assert_eq!(decode(&[0x0f, 0x01, 0xd0]), None, "xgetbv");
        assert_eq!(decode(&[]), None);
    }
}
