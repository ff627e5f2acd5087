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
            (*page_tables)[page / 512][page % 512] = if page < pages { (gpa + page as u64 * PAGE_SIZE) | PRESENT_WRITABLE } else { 0 };
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

// ---------------------------------------------------------------------------------------------
// User access: the U bit on exactly the pages ring-3 code touches.

const USER: u64 = 0x4;
const PRESENT: u64 = 0x1;
const WRITABLE: u64 = 0x2;
const LARGE_PAGE: u64 = 0x80;
const LARGE_PAGE_SIZE: u64 = 2 * 1024 * 1024;
/// Bits of an entry that hold the physical address.
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;
/// Flags a 4 KiB entry inherits from the 2 MiB page it replaces: present, writable, PWT, PCD
/// (not U, which only `allow_user_access` sets, nor PS, which means PAT in a 4 KiB entry).
const INHERITED_FLAGS: u64 = 0x1b;
/// 2 MiB pages that can be split into 4 KiB pages for user access: the image's and the
/// channel's (two, in case it straddles a 2 MiB boundary), and one spare.
const SPLIT_TABLES: usize = 4;

#[repr(C, align(4096))]
struct PageTable([u64; 512]);

static mut SPLIT_PAGE_TABLES: [PageTable; SPLIT_TABLES] = [const { PageTable([0; 512]) }; SPLIT_TABLES];
static SPLIT_TABLES_USED: AtomicUsize = AtomicUsize::new(0);

/// What ring 3 may do with the pages (the kernel never writes user code, so read-only pages
/// cost it nothing even with CR0.WP set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserAccess {
    ReadOnly,
    ReadWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserMapError {
    Empty,
    /// The address is not mapped by the current page tables.
    NotMapped(u64),
    /// More 2 MiB pages would need splitting than there are spare tables.
    NoSplitTableLeft,
}

/// Makes the 4 KiB pages covering `[start, end)` of the current (identity or window) mapping
/// accessible from ring 3 (and read-only for everyone with `UserAccess::ReadOnly`). A 2 MiB page they fall in is first split into 4 KiB pages with the
/// same frames and flags, so its other pages stay supervisor-only; the U bit on the upper levels
/// only lets the leaves decide. One vCPU at a time; other vCPUs' TLBs are not flushed.
pub fn allow_user_access(start: u64, end: u64, access: UserAccess) -> Result<(), UserMapError> {
    if start >= end {
        return Err(UserMapError::Empty);
    }
    let mut page = start & !(PAGE_SIZE - 1);
    while page < end {
        set_user_bit(page, access)?;
        page += PAGE_SIZE;
    }
    arch::flush_tlb();
    Ok(())
}

/// Sets U on every level of the walk for `address`, splitting a 2 MiB leaf on the way.
fn set_user_bit(address: u64, access: UserAccess) -> Result<(), UserMapError> {
    let index = |level_shift: u32| ((address >> level_shift) & 511) as usize;
    let pml4 = (arch::read_cr3() & ADDRESS_MASK) as *mut u64;
    // SAFETY: the page tables are identity mapped (they live in the image, below 4 GiB), and
    // only this vCPU changes them. Each step checks the present bit before following an entry;
    // a split fills the new table completely before the directory entry points at it, and it
    // maps the same frames with the same permissions, so nothing running changes meaning.
    unsafe {
        let pml4_entry = pml4.add(index(39));
        if *pml4_entry & PRESENT == 0 {
            return Err(UserMapError::NotMapped(address));
        }
        *pml4_entry |= USER;
        let pdpt_entry = ((*pml4_entry & ADDRESS_MASK) as *mut u64).add(index(30));
        if *pdpt_entry & PRESENT == 0 || *pdpt_entry & LARGE_PAGE != 0 {
            return Err(UserMapError::NotMapped(address));
        }
        *pdpt_entry |= USER;
        let directory_entry = ((*pdpt_entry & ADDRESS_MASK) as *mut u64).add(index(21));
        if *directory_entry & PRESENT == 0 {
            return Err(UserMapError::NotMapped(address));
        }
        if *directory_entry & LARGE_PAGE != 0 {
            let table_index = SPLIT_TABLES_USED.fetch_add(1, Ordering::Relaxed);
            if table_index >= SPLIT_TABLES {
                return Err(UserMapError::NoSplitTableLeft);
            }
            let table = &raw mut SPLIT_PAGE_TABLES[table_index];
            let frame = *directory_entry & ADDRESS_MASK & !(LARGE_PAGE_SIZE - 1);
            let flags = *directory_entry & INHERITED_FLAGS;
            for (slot, entry) in (*table).0.iter_mut().enumerate() {
                *entry = (frame + slot as u64 * PAGE_SIZE) | flags;
            }
            *directory_entry = table as u64 | PRESENT_WRITABLE | USER;
        } else {
            *directory_entry |= USER;
        }
        let table_entry = ((*directory_entry & ADDRESS_MASK) as *mut u64).add(index(12));
        if *table_entry & PRESENT == 0 {
            return Err(UserMapError::NotMapped(address));
        }
        *table_entry |= USER;
        if access == UserAccess::ReadOnly {
            *table_entry &= !WRITABLE;
        }
    }
    Ok(())
}
