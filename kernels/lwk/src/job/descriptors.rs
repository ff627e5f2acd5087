//! The job's file descriptors: the console streams and files of the in-memory file system.

use crate::fs::Node;
use alloc::string::String;
use alloc::vec::Vec;

pub enum Descriptor {
    /// 0, 1 and 2: standard input (always at end of file) and the console.
    Console,
    File { node: Node, offset: u64 },
    Directory { path: String, node: Node, position: usize },
}

/// Linux's default RLIMIT_NOFILE.
pub const MAX_DESCRIPTORS: usize = 1024;

pub struct Descriptors {
    table: Vec<Option<Descriptor>>,
}

impl Descriptors {
    pub fn new() -> Descriptors {
        Descriptors { table: (0..3).map(|_| Some(Descriptor::Console)).collect() }
    }

    /// Descriptors are C `int`s: only the low 32 bits of the register count.
    pub fn get(&mut self, descriptor: u64) -> Option<&mut Descriptor> {
        self.table.get_mut(descriptor as u32 as usize)?.as_mut()
    }

    /// Installs `entry` at the lowest free number, as Linux does; `None` when the table is full.
    pub fn insert(&mut self, entry: Descriptor) -> Option<u64> {
        let index = match self.table.iter().position(Option::is_none) {
            Some(index) => index,
            None if self.table.len() < MAX_DESCRIPTORS => {
                self.table.push(None);
                self.table.len() - 1
            }
            None => return None,
        };
        self.table[index] = Some(entry);
        Some(index as u64)
    }

    pub fn remove(&mut self, descriptor: u64) -> Option<Descriptor> {
        self.table.get_mut(descriptor as u32 as usize)?.take()
    }
}
