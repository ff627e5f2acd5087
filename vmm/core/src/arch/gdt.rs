//! The boot GDT and the segment registers derived from it.

use kvm_bindings::kvm_segment;

pub const CODE64_SELECTOR: u16 = 0x08;
pub const DATA_SELECTOR: u16 = 0x10;
pub const CODE32_SELECTOR: u16 = 0x18;
pub const TSS_SELECTOR: u16 = 0x20;

/// Descriptor flags in the packed layout of a GDT entry (bits 40..56 of the descriptor).
const CODE64_FLAGS: u16 = 0xa09b; // G, L, present, DPL 0, code exec/read accessed
const DATA_FLAGS: u16 = 0xc093; // G, D/B, present, DPL 0, data read/write accessed
const CODE32_FLAGS: u16 = 0xc09b; // G, D/B, present, DPL 0, code exec/read accessed
const TSS_FLAGS: u16 = 0x008b; // present, busy 32/64-bit TSS

/// Packs a legacy 8-byte descriptor.
fn descriptor(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The GDT written at `GDT_ADDR`: null, 64-bit code, data, 32-bit code, TSS (16 bytes).
pub fn boot_gdt() -> [u64; 6] {
    [
        0,
        descriptor(CODE64_FLAGS, 0, 0xfffff),
        descriptor(DATA_FLAGS, 0, 0xfffff),
        descriptor(CODE32_FLAGS, 0, 0xfffff),
        descriptor(TSS_FLAGS, 0, 0x67),
        0,
    ]
}

/// The hidden part of a segment register as KVM wants it, decoded from a descriptor.
pub fn segment(descriptor: u64, selector: u16) -> kvm_segment {
    let base = ((descriptor >> 16) & 0xff_ffff) | ((descriptor >> 32) & 0xff00_0000);
    let raw_limit = (descriptor & 0xffff) | ((descriptor >> 32) & 0xf_0000);
    let granular = (descriptor >> 55) & 1;
    let limit = if granular == 1 { (raw_limit << 12) | 0xfff } else { raw_limit };
    kvm_segment {
        base,
        limit: limit as u32,
        selector,
        type_: ((descriptor >> 40) & 0xf) as u8,
        present: ((descriptor >> 47) & 1) as u8,
        dpl: ((descriptor >> 45) & 3) as u8,
        db: ((descriptor >> 54) & 1) as u8,
        s: ((descriptor >> 44) & 1) as u8,
        l: ((descriptor >> 53) & 1) as u8,
        g: granular as u8,
        avl: ((descriptor >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code64_decodes_to_long_mode_segment() {
        let gdt = boot_gdt();
        let cs = segment(gdt[1], CODE64_SELECTOR);
        assert_eq!((cs.l, cs.db, cs.present, cs.s, cs.type_, cs.dpl), (1, 0, 1, 1, 0xb, 0));
        assert_eq!(cs.limit, 0xffff_ffff);
        let cs32 = segment(gdt[3], CODE32_SELECTOR);
        assert_eq!((cs32.l, cs32.db, cs32.type_), (0, 1, 0xb));
        let ds = segment(gdt[2], DATA_SELECTOR);
        assert_eq!((ds.type_, ds.db, ds.g), (3, 1, 1));
        let tr = segment(gdt[4], TSS_SELECTOR);
        assert_eq!((tr.type_, tr.s, tr.limit, tr.g), (0xb, 0, 0x67, 0));
    }

    #[test]
    fn known_descriptor_encoding() {
        // The classic flat 64-bit code descriptor.
        assert_eq!(boot_gdt()[1], 0x00af_9b00_0000_ffff);
        assert_eq!(boot_gdt()[2], 0x00cf_9300_0000_ffff);
    }
}
