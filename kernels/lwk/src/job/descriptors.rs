//! The job's file descriptors: the console streams and files of the in-memory file system.
//! Like Linux's, a descriptor names an open file description: `dup` shares it, offset
//! included.

use crate::arch::sync::{SpinGuard, SpinLock};
use crate::fs::Node;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

pub enum Descriptor {
    /// 0, 1 and 2: standard input (always at end of file) and the console.
    Console,
    File { node: Node, offset: u64 },
    Directory { path: String, node: Node, position: usize },
    /// A file on the host (a persistent enclave's job): `handle` is the host's number for it,
    /// `status_flags` the access mode and status flags it was opened with (`F_GETFL`).
    Remote { handle: u32, status_flags: u32 },
    /// `/dev/xpmem` (`crate::xpmem`): only ioctl does anything.
    Xpmem,
}

/// Linux's default RLIMIT_NOFILE.
pub const MAX_DESCRIPTORS: usize = 1024;

type OpenFile = Arc<SpinLock<Descriptor>>;

pub struct Descriptors {
    table: Vec<Option<OpenFile>>,
}

impl Descriptors {
    pub fn new() -> Descriptors {
        Descriptors { table: (0..3).map(|_| Some(Arc::new(SpinLock::new(Descriptor::Console)))).collect() }
    }

    /// Descriptors are C `int`s: only the low 32 bits of the register count.
    pub fn get(&mut self, descriptor: u64) -> Option<SpinGuard<'_, Descriptor>> {
        Some(self.table.get(descriptor as u32 as usize)?.as_ref()?.lock())
    }

    /// The lowest free number from `lowest` on, the table grown to hold it.
    fn free_slot(&mut self, lowest: usize) -> Option<usize> {
        let index = (lowest..self.table.len()).find(|&index| self.table[index].is_none()).unwrap_or(self.table.len().max(lowest));
        if index >= MAX_DESCRIPTORS {
            return None;
        }
        if index >= self.table.len() {
            self.table.resize(index + 1, None);
        }
        Some(index)
    }

    /// Installs `entry` at the lowest free number, as Linux does; `None` when the table is full.
    pub fn insert(&mut self, entry: Descriptor) -> Option<u64> {
        let index = self.free_slot(0)?;
        self.table[index] = Some(Arc::new(SpinLock::new(entry)));
        Some(index as u64)
    }

    /// `dup`: a new number, at least `lowest`, for the same open file; `None` when `from` is
    /// not open (or the table is full: `Err`).
    pub fn duplicate(&mut self, from: u64, lowest: u64) -> Result<u64, DuplicateError> {
        let open = self.table.get(from as u32 as usize).and_then(Option::clone).ok_or(DuplicateError::NotOpen)?;
        let index = self.free_slot(lowest as usize).ok_or(DuplicateError::TableFull)?;
        self.table[index] = Some(open);
        Ok(index as u64)
    }

    /// `dup2`: makes `to` name the open file of `from`, closing what `to` named.
    pub fn duplicate_to(&mut self, from: u64, to: u64) -> Result<u64, DuplicateError> {
        let open = self.table.get(from as u32 as usize).and_then(Option::clone).ok_or(DuplicateError::NotOpen)?;
        let to = to as u32 as usize;
        if to >= MAX_DESCRIPTORS {
            return Err(DuplicateError::TableFull);
        }
        if self.table.len() <= to {
            self.table.resize(to + 1, None);
        }
        self.table[to] = Some(open);
        Ok(to as u64)
    }

    pub fn remove(&mut self, descriptor: u64) -> Option<()> {
        self.table.get_mut(descriptor as u32 as usize)?.take().map(|_| ())
    }
}

pub enum DuplicateError {
    NotOpen,
    TableFull,
}
