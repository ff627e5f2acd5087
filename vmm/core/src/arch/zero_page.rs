//! The Linux boot protocol's zero page (`struct boot_params`) for bzImage kernels.

use super::layout::*;
use super::memmap::MemoryMapEntry;
use linux_loader::loader::bootparam::{boot_params, setup_header};

/// Boot protocol magic "HdrS" at offset 0x202 of a bzImage.
pub const HDRS_MAGIC: u32 = 0x5372_6448;
/// The loader type that says "undefined boot loader".
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// `loadflags`: kernel loaded high, at 1 MiB.
const LOADED_HIGH: u8 = 0x01;
/// `loadflags`: the loader may use the heap up to `heap_end_ptr`.
const CAN_USE_HEAP: u8 = 0x80;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Initrd {
    pub gpa: u64,
    pub size: u64,
}

/// Fills a zero page from the kernel's own setup header.
pub fn build(header: setup_header, memory_map: &[MemoryMapEntry], initrd: Option<Initrd>) -> boot_params {
    let mut params = boot_params { hdr: header, ..Default::default() };
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.loadflags |= LOADED_HIGH | CAN_USE_HEAP;
    params.hdr.heap_end_ptr = 0xfe00;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    if let Some(rd) = initrd {
        params.hdr.ramdisk_image = rd.gpa as u32;
        params.hdr.ramdisk_size = rd.size as u32;
        params.ext_ramdisk_image = (rd.gpa >> 32) as u32;
        params.ext_ramdisk_size = (rd.size >> 32) as u32;
    }
    let count = memory_map.len().min(params.e820_table.len());
    for (slot, entry) in params.e820_table.iter_mut().zip(memory_map) {
        slot.addr = entry.addr;
        slot.size = entry.size;
        slot.r#type = entry.kind as u32;
    }
    params.e820_entries = count as u8;
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::memmap::GuestLayout;

    #[test]
    fn zero_page_carries_e820_cmdline_and_initrd() {
        let layout = GuestLayout::new(256 * MIB, 65536).unwrap();
        let header = setup_header { header: HDRS_MAGIC, version: 0x20f, ..Default::default() };
        let rd = Initrd { gpa: 0x0f00_0000, size: 4096 };
        let header = setup_header { cmdline_size: 2047, ..header };
        let p = build(header, &layout.memory_map(), Some(rd));
        assert_eq!({ p.hdr.cmdline_size }, 2047, "the kernel's own limit is kept");
        assert_eq!({ p.e820_entries }, 4);
        assert_eq!({ p.e820_table[2].addr }, MIB);
        assert_eq!({ p.e820_table[3].r#type }, 2);
        assert_eq!({ p.hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
        assert_eq!({ p.hdr.ramdisk_image }, 0x0f00_0000);
        assert_eq!({ p.hdr.ramdisk_size }, 4096);
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
        assert_eq!({ p.hdr.header }, HDRS_MAGIC, "the kernel's header is kept");
    }
}
