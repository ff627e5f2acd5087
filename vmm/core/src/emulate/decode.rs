//! Decoding the few instructions the VMM carries out for the guest kernel (pure: bytes in,
//! instruction out; `None` for anything else, which is then left to fail as it did).

use kvm_bindings::kvm_regs;

/// The longest x86 instruction.
pub const MAX_LENGTH: usize = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instruction {
    /// An exception the instruction raises once RIP is past it (INT3: #BP).
    Trap { vector: u8 },
    /// XSAVE or XRSTOR of the state components in EDX:EAX & XCR0 to or from `operand`.
    /// `wide` (REX.W: XSAVE64/XRSTOR64) stores the x87 FPU's instruction and data pointers as
    /// 64 bits; without it as 32 bits and a selector.
    Xstate { restore: bool, wide: bool, operand: Memory },
}

/// A decoded instruction and its length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub instruction: Instruction,
    pub length: u64,
}

/// A ModRM memory operand in 64-bit mode: `[base + index * scale + displacement]`, or
/// RIP-relative (`[next RIP + displacement]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub base: Option<u8>,
    pub index: Option<(u8, u8)>,
    pub displacement: i32,
    pub rip_relative: bool,
}

impl Memory {
    /// The linear address for the registers `regs` of an instruction of `length` bytes at
    /// `regs.rip` (64-bit mode: segment bases are zero for the segments these may use).
    pub fn address(&self, regs: &kvm_regs, length: u64) -> u64 {
        let mut address = self.displacement as i64 as u64;
        if self.rip_relative {
            address = address.wrapping_add(regs.rip.wrapping_add(length));
        }
        if let Some(base) = self.base {
            address = address.wrapping_add(register(regs, base));
        }
        if let Some((index, scale)) = self.index {
            address = address.wrapping_add(register(regs, index).wrapping_mul(scale as u64));
        }
        address
    }
}

/// A general register by its encoding (0 = RAX ... 15 = R15).
fn register(regs: &kvm_regs, number: u8) -> u64 {
    let all = [
        regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi, regs.r8, regs.r9, regs.r10, regs.r11, regs.r12,
        regs.r13, regs.r14, regs.r15,
    ];
    all[number as usize & 15]
}

const BREAKPOINT: u8 = 3;

/// The instruction at the start of `code` (up to [`MAX_LENGTH`] bytes; fewer if the rest could
/// not be read), if it is one the VMM carries out.
pub fn decode(code: &[u8]) -> Option<Decoded> {
    match code {
        [0xcc, ..] => return Some(Decoded { instruction: Instruction::Trap { vector: BREAKPOINT }, length: 1 }),
        [0xcd, 0x03, ..] => return Some(Decoded { instruction: Instruction::Trap { vector: BREAKPOINT }, length: 2 }),
        _ => {}
    }
    // XSAVE and XRSTOR: [REX] 0F AE /4 and /5 with a memory operand. No other prefix: F3 0F AE /4
    // is PTWRITE, and operand- or address-size overrides are not what Linux emits.
    let (rex, rest) = match code {
        [prefix @ 0x40..=0x4f, rest @ ..] => (*prefix, rest),
        _ => (0, code),
    };
    let [0x0f, 0xae, modrm_and_rest @ ..] = rest else { return None };
    let (operand, operand_length) = memory_operand(rex, modrm_and_rest)?;
    let restore = match (modrm_and_rest[0] >> 3) & 7 {
        4 => false,
        5 => true,
        _ => return None,
    };
    let length = (code.len() - rest.len() + 2 + operand_length) as u64;
    Some(Decoded { instruction: Instruction::Xstate { restore, wide: rex & 0x08 != 0, operand }, length })
}

/// The memory operand of the ModRM byte at the start of `bytes` (with its SIB byte and
/// displacement) and how many bytes it took; `None` for a register operand or missing bytes.
fn memory_operand(rex: u8, bytes: &[u8]) -> Option<(Memory, usize)> {
    let modrm = *bytes.first()?;
    let (mode, rm) = (modrm >> 6, modrm & 7);
    if mode == 3 {
        return None;
    }
    let rex_b = (rex & 1) << 3;
    let rex_x = (rex & 2) << 2;
    let mut used = 1;
    let mut operand = Memory { base: Some(rm | rex_b), index: None, displacement: 0, rip_relative: false };
    let mut displacement_size = match mode {
        1 => 1,
        2 => 4,
        _ => 0,
    };
    if rm == 4 {
        let sib = *bytes.get(1)?;
        used += 1;
        let (scale, index, base) = (1u8 << (sib >> 6), ((sib >> 3) & 7) | rex_x, sib & 7);
        // Index 4 (RSP) without REX.X means no index.
        operand.index = (index != 4).then_some((index, scale));
        operand.base = Some(base | rex_b);
        if base == 5 && mode == 0 {
            operand.base = None;
            displacement_size = 4;
        }
    } else if rm == 5 && mode == 0 {
        operand.base = None;
        operand.rip_relative = true;
        displacement_size = 4;
    }
    let displacement = bytes.get(used..used + displacement_size)?;
    operand.displacement = match *displacement {
        [byte] => byte as i8 as i32,
        [a, b, c, d] => i32::from_le_bytes([a, b, c, d]),
        _ => 0,
    };
    Some((operand, used + displacement_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xstate(code: &[u8]) -> (bool, bool, Memory, u64) {
        match decode(code) {
            Some(Decoded { instruction: Instruction::Xstate { restore, wide, operand }, length }) => (restore, wide, operand, length),
            other => panic!("{code:02x?} decoded as {other:?}"),
        }
    }

    fn based(base: u8, displacement: i32) -> Memory {
        Memory { base: Some(base), index: None, displacement, rip_relative: false }
    }

    #[test]
    fn int3_traps_past_its_one_or_two_bytes() {
        assert_eq!(decode(&[0xcc, 0x90]), Some(Decoded { instruction: Instruction::Trap { vector: 3 }, length: 1 }));
        assert_eq!(decode(&[0xcc]), Some(Decoded { instruction: Instruction::Trap { vector: 3 }, length: 1 }));
        assert_eq!(decode(&[0xcd, 0x03]), Some(Decoded { instruction: Instruction::Trap { vector: 3 }, length: 2 }));
    }

    #[test]
    fn linux_xsave64_and_xrstor64_of_rdi() {
        // What Linux 6.1's XSTATE_OP emits: `.byte 0x48,0x0f,0xae,0x27` and `...0x2f`.
        assert_eq!(xstate(&[0x48, 0x0f, 0xae, 0x27, 0x90]), (false, true, based(7, 0), 4));
        assert_eq!(xstate(&[0x48, 0x0f, 0xae, 0x2f]), (true, true, based(7, 0), 4));
        assert_eq!(xstate(&[0x0f, 0xae, 0x27]), (false, false, based(7, 0), 3), "XSAVE without REX.W");
    }

    #[test]
    fn every_memory_form() {
        // xsave64 0x10(%rax): disp8.
        assert_eq!(xstate(&[0x48, 0x0f, 0xae, 0x60, 0x10]), (false, true, based(0, 0x10), 5));
        // xrstor -0x80(%r13): REX.B, disp8 sign-extended (base 5 with mod 1 is R13, not RIP).
        assert_eq!(xstate(&[0x41, 0x0f, 0xae, 0x6d, 0x80]), (true, false, based(13, -0x80), 5));
        // xsave 0x12345678(%rbx): disp32.
        assert_eq!(xstate(&[0x0f, 0xae, 0xa3, 0x78, 0x56, 0x34, 0x12]), (false, false, based(3, 0x1234_5678), 7));
        // xsave (%rsp): SIB with no index.
        assert_eq!(xstate(&[0x0f, 0xae, 0x24, 0x24]), (false, false, based(4, 0), 4));
        // xrstor64 8(%rdx,%r9,4): SIB with REX.X index and scale.
        let indexed = Memory { base: Some(2), index: Some((9, 4)), displacement: 8, rip_relative: false };
        assert_eq!(xstate(&[0x4a, 0x0f, 0xae, 0x6c, 0x8a, 0x08]), (true, true, indexed, 6));
        // xsave 0x1000(,%rcx,8): SIB, no base, disp32.
        let absolute = Memory { base: None, index: Some((1, 8)), displacement: 0x1000, rip_relative: false };
        assert_eq!(xstate(&[0x0f, 0xae, 0x24, 0xcd, 0x00, 0x10, 0x00, 0x00]), (false, false, absolute, 8));
        // xrstor 0x40(%rip).
        let relative = Memory { base: None, index: None, displacement: 0x40, rip_relative: true };
        assert_eq!(xstate(&[0x0f, 0xae, 0x2d, 0x40, 0, 0, 0]), (true, false, relative, 7));
    }

    #[test]
    fn addresses_from_registers() {
        let regs = kvm_regs { rip: 0x1000, rdx: 0x5000, r9: 3, rdi: 0xffff_8880_0000_0040, ..Default::default() };
        let indexed = Memory { base: Some(2), index: Some((9, 4)), displacement: 8, rip_relative: false };
        assert_eq!(indexed.address(&regs, 6), 0x5000 + 12 + 8);
        assert_eq!(based(7, -0x40).address(&regs, 4), 0xffff_8880_0000_0000);
        let relative = Memory { base: None, index: None, displacement: 0x40, rip_relative: true };
        assert_eq!(relative.address(&regs, 7), 0x1000 + 7 + 0x40, "relative to the next instruction");
    }

    #[test]
    fn other_instructions_are_left_to_fail() {
        assert_eq!(decode(&[0xcd, 0x80]), None, "int $0x80 is not carried out");
        assert_eq!(decode(&[0x0f, 0xc7, 0x0e]), None, "cmpxchg16b");
        assert_eq!(decode(&[0x0f, 0xae, 0x37]), None, "xsaveopt");
        assert_eq!(decode(&[0x0f, 0xae, 0x07]), None, "fxsave");
        assert_eq!(decode(&[0x0f, 0xae, 0xe8]), None, "lfence: /5 with a register operand");
        assert_eq!(decode(&[0x48, 0x0f, 0xc7, 0x2f]), None, "xsaves");
        assert_eq!(decode(&[0xf3, 0x0f, 0xae, 0x27]), None, "ptwrite");
        assert_eq!(decode(&[0x66, 0x0f, 0xae, 0x27]), None, "operand-size prefix");
        assert_eq!(decode(&[0x0f, 0xae, 0x60]), None, "disp8 missing");
        assert_eq!(decode(&[0x0f, 0xae, 0x24]), None, "SIB missing");
        assert_eq!(decode(&[0x48, 0x0f]), None);
        assert_eq!(decode(&[]), None);
    }
}
