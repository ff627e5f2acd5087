//! A window in our own page tables for memory regions the host adds at run time.
//!
//! Such regions sit at guest-physical addresses above all RAM, possibly above the 4 GiB the boot
//! tables identity-map, so the guest maps them itself: PML4 slot 1 (virtual 512 GiB) points at a
//! static PDPT -> page directory -> four page tables of 4 KiB pages, 8 MiB in all.

use crate::arch;
use crate::boot::{self, REGION_PAGE_TABLES};

pub const REGION_WINDOW: u64 = 1 << 39;
pub const REGION_WINDOW_SIZE: u64 = REGION_PAGE_TABLES as u64 * 512 * PAGE_SIZE;
const PAGE_SIZE: u64 = 4096;
const PRESENT_WRITABLE: u64 = 0x3;
/// Physical addresses have at most 52 bits on x86-64.
const PHYSICAL_ADDRESS_LIMIT: u64 = 1 << 52;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    Unaligned,
    Empty,
    TooLarge,
    BeyondPhysicalAddresses,
}

/// Maps `[gpa, gpa + size)` at `REGION_WINDOW`, replacing any earlier mapping; returns the
/// window's address. One vCPU at a time.
pub fn map_region(gpa: u64, size: u64) -> Result<*mut u64, MapError> {
    if gpa % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 {
        return Err(MapError::Unaligned);
    }
    if size == 0 {
        return Err(MapError::Empty);
    }
    if size > REGION_WINDOW_SIZE {
        return Err(MapError::TooLarge);
    }
    if gpa.checked_add(size).is_none_or(|end| end > PHYSICAL_ADDRESS_LIMIT) {
        return Err(MapError::BeyondPhysicalAddresses);
    }
    let (pdpt, page_directory, page_tables) = boot::region_tables();
    let pages = (size / PAGE_SIZE) as usize;
    // SAFETY: the tables are static, used by no one else, and only reachable through the window,
    // which nothing uses while we rewrite it.
    unsafe {
        for table in 0..REGION_PAGE_TABLES {
            for entry in 0..512 {
                let page = table * 512 + entry;
                (*page_tables)[table][entry] = if page < pages {
                    (gpa + page as u64 * PAGE_SIZE) | PRESENT_WRITABLE
                } else {
                    0
                };
            }
            (*page_directory)[table] = (&raw const (*page_tables)[table]) as u64 | PRESENT_WRITABLE;
        }
        (*pdpt)[0] = page_directory as u64 | PRESENT_WRITABLE;
    }
    arch::flush_tlb();
    Ok(REGION_WINDOW as *mut u64)
}
