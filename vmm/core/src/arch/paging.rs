//! Identity page tables for vCPUs started directly in 64-bit mode.

use super::layout::*;

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const HUGE: u64 = 1 << 7;
/// Page directories needed to cover the low 4 GiB with 2 MiB pages.
pub const IDENTITY_PDS: u64 = 4;

/// The page-table pages as (guest-physical address, 4 KiB contents): one PML4, one PDPT and four
/// page directories mapping `[0, 4 GiB)` one to one with 2 MiB pages.
pub fn identity_tables() -> Vec<(u64, Vec<u8>)> {
    let mut pages = Vec::new();
    let mut pml4 = vec![0u8; PAGE_SIZE as usize];
    pml4[..8].copy_from_slice(&(PDPT_ADDR | PRESENT | WRITABLE).to_le_bytes());
    pages.push((PML4_ADDR, pml4));
    let mut pdpt = vec![0u8; PAGE_SIZE as usize];
    for i in 0..IDENTITY_PDS {
        let entry = (PD_ADDR + i * PAGE_SIZE) | PRESENT | WRITABLE;
        pdpt[i as usize * 8..i as usize * 8 + 8].copy_from_slice(&entry.to_le_bytes());
    }
    pages.push((PDPT_ADDR, pdpt));
    for i in 0..IDENTITY_PDS {
        let mut pd = vec![0u8; PAGE_SIZE as usize];
        for j in 0..512u64 {
            let phys = (i * 512 + j) * 2 * MIB;
            let off = j as usize * 8;
            pd[off..off + 8].copy_from_slice(&(phys | PRESENT | WRITABLE | HUGE).to_le_bytes());
        }
        pages.push((PD_ADDR + i * PAGE_SIZE, pd));
    }
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the tables like the MMU does for a 2 MiB mapping.
    fn translate(pages: &[(u64, Vec<u8>)], va: u64) -> Option<u64> {
        let read = |table: u64, index: u64| -> u64 {
            let page = &pages.iter().find(|(a, _)| *a == table).unwrap().1;
            u64::from_le_bytes(page[index as usize * 8..index as usize * 8 + 8].try_into().unwrap())
        };
        let pml4e = read(PML4_ADDR, (va >> 39) & 511);
        if pml4e & PRESENT == 0 {
            return None;
        }
        let pdpte = read(pml4e & !0xfff, (va >> 30) & 511);
        if pdpte & PRESENT == 0 {
            return None;
        }
        let pde = read(pdpte & !0xfff, (va >> 21) & 511);
        assert!(pde & HUGE != 0);
        Some((pde & !0x1f_ffff & !(1 << 63)) | (va & 0x1f_ffff))
    }

    #[test]
    fn identity_maps_low_4g() {
        let pages = identity_tables();
        for va in [0u64, 0x1234, MIB, 0x3fff_ffff, 0xfee0_0000, 4 * GIB - 1] {
            assert_eq!(translate(&pages, va), Some(va), "va {va:#x}");
        }
        assert_eq!(translate(&pages, 4 * GIB), None);
    }
}
