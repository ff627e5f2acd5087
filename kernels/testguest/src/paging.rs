//! A window in our own page tables for memory regions the host adds at run time.
//!
//! Such regions sit at guest-physical addresses above all RAM, possibly above the 4 GiB the boot
//! tables identity-map, so the guest maps them itself: PML4 slot 1 (virtual 512 GiB) points at a
//! static PDPT -> page directory -> four page tables of 4 KiB pages, 8 MiB in all.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::arch;
use crate::boot::{self, REGION_PAGE_TABLES};

pub const REGION_WINDOW: u64 = 1 << 39;
pub const REGION_WINDOW_SIZE: u64 = REGION_PAGE_TABLES as u64 * 512 * PAGE_SIZE;
const PAGE_SIZE: u64 = 4096;
const PRESENT_WRITABLE: u64 = 0x3;
/// Physical addresses have at most 52 bits on x86-64.
const PHYSICAL_ADDRESS_LIMIT: u64 = 1 << 52;
/// Pages the current mapping uses, so a new one clears only what an old one set.
static MAPPED_PAGES: AtomicUsize = AtomicUsize::new(0);

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
    if !gpa.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
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
    let touched = pages.max(MAPPED_PAGES.load(Ordering::Relaxed));
    // SAFETY: the tables are static, used by no one else, and only reachable through the window,
    // which nothing uses while we rewrite it.
    unsafe {
        for page in 0..touched {
            (*page_tables)[page / 512][page % 512] =
                if page < pages { (gpa + page as u64 * PAGE_SIZE) | PRESENT_WRITABLE } else { 0 };
        }
        for table in 0..REGION_PAGE_TABLES {
            (*page_directory)[table] = (&raw const (*page_tables)[table]) as u64 | PRESENT_WRITABLE;
        }
        (*pdpt)[0] = page_directory as u64 | PRESENT_WRITABLE;
    }
    MAPPED_PAGES.store(pages, Ordering::Relaxed);
    arch::flush_tlb();
    Ok(REGION_WINDOW as *mut u64)
}
