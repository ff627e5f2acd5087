//! A user address space: page tables whose kernel half is shared, with new table pages taken
//! from `pmem` and recorded, so that they go back without reading the tables.

use super::{pmem, OwnedTables};
use crate::arch::paging::{OutOfMemory, PageTables, Protection, Translation};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

pub struct AddressSpace {
    tables: PageTables,
    /// Never reused (unlike the root's physical page): a CPU compares it with the address
    /// space it has loaded to know whether CR3 must be written.
    id: u64,
    /// Every table page linked into these tables, the root included, and the pages of its
    /// own `map_own_page` mapped: all go back with the tables.
    owned: Vec<u64>,
    /// Bumped by every map and unmap: what was read from the tables (XPMEM's resolved runs)
    /// still holds while this has not moved.
    changes: u64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Every address space's maps and unmaps, and their creation and teardown, counted together
/// and bumped before the tables change: the host reads it in guest memory (the
/// `MappingCounter` message says where) to know that frames it had resolved for a segment
/// are still the ones mapped, without asking this kernel again, and maps the piece of RAM
/// holding it read-only into enclaves that attach this enclave's memory, whose kernels read it
/// before they take a detached attachment up again (`xemem::wire::MappingWord`). So once the
/// host is there the count moves to a piece of RAM of its own ([`publish_mapping_changes`]):
/// nothing else of this kernel is seen there. Until then it is this word.
static BOOT_MAPPING_CHANGES: AtomicU64 = AtomicU64::new(0);
/// The published piece's physical address; 0 while the count is in the boot word.
static MAPPING_CHANGES: AtomicU64 = AtomicU64::new(0);

fn mapping_changes() -> &'static AtomicU64 {
    match MAPPING_CHANGES.load(Ordering::Acquire) {
        0 => &BOOT_MAPPING_CHANGES,
        physical => crate::arch::phys::atomic_u64(physical),
    }
}

/// Moves the count to a zeroed piece of RAM of its own, `piece` bytes (the smallest the host
/// can share: a 4 KiB page, or a 2 MiB page of hugetlb-backed RAM) aligned as much, and
/// returns its guest-physical address. `None` when there is no such memory: the count stays
/// in the boot word, which is not published (the piece of RAM around it holds the kernel's
/// own data). Called once, when the channel comes up, before any job runs: nothing counts
/// meanwhile.
pub fn publish_mapping_changes(piece: u64) -> Option<u64> {
    let physical = super::pmem::allocate(piece, piece)?;
    // A fresh, zeroed piece of RAM that only this word uses from now on.
    crate::arch::phys::atomic_u64(physical).store(BOOT_MAPPING_CHANGES.load(Ordering::Acquire) + 1, Ordering::Release);
    MAPPING_CHANGES.store(physical, Ordering::Release);
    Some(physical)
}

fn count_mapping_change() {
    mapping_changes().fetch_add(1, Ordering::Release);
}

impl AddressSpace {
    pub fn new() -> Result<AddressSpace, OutOfMemory> {
        let mut owned = Vec::new();
        count_mapping_change();
        let tables = super::new_user_tables(&mut owned).ok_or(OutOfMemory)?;
        Ok(AddressSpace { tables, id: NEXT_ID.fetch_add(1, Ordering::Relaxed), owned, changes: 0 })
    }

    /// What a thread needs to switch to this address space: its id and root table.
    pub fn handle(&self) -> (u64, u64) {
        (self.id, self.tables.root())
    }

    /// The mappings of `[start, end)` (`PageTables::for_each_user_leaf_in`).
    pub fn for_each_leaf_in(&self, start: u64, end: u64, leaf: impl FnMut(u64, u64, u64, Protection, bool)) {
        self.tables.for_each_user_leaf_in(start, end, leaf);
    }

    /// The mappings of `[start, end)` as runs contiguous on both sides
    /// (`PageTables::for_each_user_run_in`).
    pub fn for_each_run_in(&self, start: u64, end: u64, run: impl FnMut(u64, u64, u64, Protection)) {
        self.tables.for_each_user_run_in(start, end, run);
    }

    pub fn activate(&self) {
        self.tables.activate();
    }

    /// How many maps and unmaps these tables have seen (see `changes`).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn map(&mut self, virtual_address: u64, physical: u64, len: u64, protection: Protection) -> Result<(), OutOfMemory> {
        count_mapping_change();
        self.changes += 1;
        self.tables.map(virtual_address, physical, len, protection, &mut OwnedTables { owned: &mut self.owned })
    }

    /// See `PageTables::make_page_writable` (a write fault's own page).
    pub fn make_page_writable(&mut self, virtual_address: u64, physical: u64) -> bool {
        count_mapping_change();
        self.changes += 1;
        self.tables.make_page_writable(virtual_address, physical)
    }

    /// Maps a fresh, zeroed page that belongs to this address space (the fast calls' scratch
    /// page, `arch::fastcall`) at `virtual_address`; it is freed with the tables.
    pub fn map_own_page(&mut self, virtual_address: u64, protection: Protection) -> Result<(), OutOfMemory> {
        let page = pmem::allocate_pages(1).ok_or(OutOfMemory)?;
        self.owned.push(page);
        self.map(virtual_address, page, crate::arch::paging::PAGE_SIZE, protection)
    }

    pub fn unmap(&mut self, virtual_address: u64, len: u64) -> Result<(), OutOfMemory> {
        count_mapping_change();
        self.changes += 1;
        self.tables.unmap(virtual_address, len, &mut OwnedTables { owned: &mut self.owned })
    }

    /// See `PageTables::suspend`.
    pub fn suspend(&mut self, start: u64, end: u64) {
        count_mapping_change();
        self.changes += 1;
        self.tables.suspend(start, end);
    }

    /// See `PageTables::resume`.
    pub fn resume(&mut self, start: u64, end: u64) {
        count_mapping_change();
        self.changes += 1;
        self.tables.resume(start, end);
    }

    /// See `PageTables::drop_suspended`.
    pub fn drop_suspended(&mut self, start: u64, end: u64) {
        count_mapping_change();
        self.changes += 1;
        self.tables.drop_suspended(start, end, &mut OwnedTables { owned: &mut self.owned });
    }

    /// Frees the page tables (not the memory they map, but for `map_own_page`'s). No CPU may
    /// have them loaded.
    pub fn free(self) {
        count_mapping_change();
        for table in self.owned {
            pmem::free_pages(table, 1);
        }
    }

    /// See `PageTables::translate`: the translation, or how many bytes are unmapped from here.
    pub fn translate(&mut self, virtual_address: u64) -> Result<Translation, u64> {
        self.tables.translate(virtual_address)
    }
}
