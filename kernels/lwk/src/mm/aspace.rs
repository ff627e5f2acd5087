//! A user address space: page tables whose kernel half is shared, with new table pages taken
//! from `pmem`.

use super::PmemTables;
use crate::arch::paging::{OutOfMemory, PageTables, Protection, Translation};

pub struct AddressSpace {
    tables: PageTables,
}

impl AddressSpace {
    pub fn new() -> Result<AddressSpace, OutOfMemory> {
        Ok(AddressSpace { tables: super::new_user_tables().ok_or(OutOfMemory)? })
    }

    pub fn activate(&self) {
        self.tables.activate();
    }

    pub fn map(&mut self, virtual_address: u64, physical: u64, len: u64, protection: Protection) -> Result<(), OutOfMemory> {
        self.tables.map(virtual_address, physical, len, protection, &mut PmemTables)
    }

    pub fn unmap(&mut self, virtual_address: u64, len: u64) -> Result<(), OutOfMemory> {
        self.tables.unmap(virtual_address, len, &mut PmemTables)
    }

    /// Frees the page tables (not the memory they map). No CPU may have them loaded.
    pub fn free(self) {
        self.tables.free_user_tables(&mut PmemTables);
    }

    /// See `PageTables::translate`: the translation, or how many bytes are unmapped from here.
    pub fn translate(&mut self, virtual_address: u64) -> Result<Translation, u64> {
        self.tables.translate(virtual_address)
    }
}
