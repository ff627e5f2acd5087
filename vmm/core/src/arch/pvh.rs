//! The PVH boot structures: `hvm_start_info`, the module list and the memory map, serialised
//! little-endian exactly as xen/include/public/arch-x86/hvm/start_info.h lays them out.

use super::layout::*;
use super::memmap::MemoryMapEntry;

pub const START_INFO_MAGIC: u32 = 0x336e_c578;
pub const START_INFO_VERSION: u32 = 1;
pub const START_INFO_SIZE: usize = 56;
pub const MODLIST_ENTRY_SIZE: usize = 32;
pub const MEMMAP_ENTRY_SIZE: usize = 24;

/// A module (initrd, job binary...) already placed in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Module {
    pub gpa: u64,
    pub size: u64,
}

/// The three PVH blobs and where each goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvhBlobs {
    pub start_info: Vec<u8>,
    pub modlist: Vec<u8>,
    pub memmap: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PvhError {
    TooManyModules(usize),
    TooManyMemoryMapEntries(usize),
}

impl std::fmt::Display for PvhError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PvhError::TooManyModules(n) => {
                write!(f, "{n} modules given, at most {MODLIST_MAX_ENTRIES} fit in the module list")
            }
            PvhError::TooManyMemoryMapEntries(n) => write!(f, "{n} memory-map entries do not fit"),
        }
    }
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Builds the blobs for `START_INFO_ADDR`, `MODLIST_ADDR` and `MEMMAP_ADDR`.
pub fn build(memory_map: &[MemoryMapEntry], modules: &[Module]) -> Result<PvhBlobs, PvhError> {
    if modules.len() > MODLIST_MAX_ENTRIES {
        return Err(PvhError::TooManyModules(modules.len()));
    }
    if memory_map.len() > MEMMAP_MAX_ENTRIES {
        return Err(PvhError::TooManyMemoryMapEntries(memory_map.len()));
    }
    let mut start_info = Vec::with_capacity(START_INFO_SIZE);
    put_u32(&mut start_info, START_INFO_MAGIC);
    put_u32(&mut start_info, START_INFO_VERSION);
    put_u32(&mut start_info, 0); // flags
    put_u32(&mut start_info, modules.len() as u32);
    put_u64(&mut start_info, if modules.is_empty() { 0 } else { MODLIST_ADDR });
    put_u64(&mut start_info, CMDLINE_ADDR);
    put_u64(&mut start_info, 0); // rsdp_paddr: no ACPI
    put_u64(&mut start_info, MEMMAP_ADDR);
    put_u32(&mut start_info, memory_map.len() as u32);
    put_u32(&mut start_info, 0); // reserved

    let mut modlist = Vec::with_capacity(modules.len() * MODLIST_ENTRY_SIZE);
    for m in modules {
        put_u64(&mut modlist, m.gpa);
        put_u64(&mut modlist, m.size);
        put_u64(&mut modlist, 0); // per-module command line: none
        put_u64(&mut modlist, 0);
    }

    let mut memmap = Vec::with_capacity(memory_map.len() * MEMMAP_ENTRY_SIZE);
    for e in memory_map {
        put_u64(&mut memmap, e.addr);
        put_u64(&mut memmap, e.size);
        put_u32(&mut memmap, e.kind as u32);
        put_u32(&mut memmap, 0);
    }
    Ok(PvhBlobs { start_info, modlist, memmap })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::memmap::GuestLayout;

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn start_info_fields_are_where_the_header_says() {
        let layout = GuestLayout::new(64 * MIB, 65536).unwrap();
        let map = layout.memory_map();
        let mods = [Module { gpa: 0x300_0000, size: 1234 }, Module { gpa: 0x310_0000, size: 99 }];
        let b = build(&map, &mods).unwrap();
        assert_eq!(b.start_info.len(), START_INFO_SIZE);
        assert_eq!(u32_at(&b.start_info, 0), 0x336e_c578);
        assert_eq!(u32_at(&b.start_info, 4), 1);
        assert_eq!(u32_at(&b.start_info, 12), 2);
        assert_eq!(u64_at(&b.start_info, 16), MODLIST_ADDR);
        assert_eq!(u64_at(&b.start_info, 24), CMDLINE_ADDR);
        assert_eq!(u64_at(&b.start_info, 40), MEMMAP_ADDR);
        assert_eq!(u32_at(&b.start_info, 48) as usize, map.len());
        assert_eq!(u64_at(&b.modlist, 32), 0x310_0000);
        assert_eq!(u64_at(&b.modlist, 40), 99);
        assert_eq!(b.memmap.len(), map.len() * MEMMAP_ENTRY_SIZE);
        assert_eq!(u64_at(&b.memmap, 24 * 2), MIB);
        assert_eq!(u32_at(&b.memmap, 24 + 16), 2, "legacy hole is reserved");
    }

    #[test]
    fn no_modules_means_null_modlist() {
        let b = build(&GuestLayout::new(4 * MIB, 0).unwrap().memory_map(), &[]).unwrap();
        assert_eq!(u64_at(&b.start_info, 16), 0);
        assert!(b.modlist.is_empty());
    }

    #[test]
    fn too_many_modules_is_an_error() {
        let mods = vec![Module { gpa: 0, size: 0 }; MODLIST_MAX_ENTRIES + 1];
        assert!(matches!(build(&[], &mods), Err(PvhError::TooManyModules(_))));
    }
}
