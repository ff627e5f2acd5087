//! A process's file descriptors: the console streams, files of the in-memory file system,
//! host files, pipes. Like Linux's, a descriptor names an open file description: `dup` and
//! `fork` share it, offset included; the close-on-exec flag is the descriptor's own.
//!
//! In an enclave whose host serves the job's ring-3 file calls, the first `RING3_FDS` numbers
//! are also kept in a table the host reads and writes (`enclave_proto::slots`, `RING3_FD_*`):
//! the host opens and closes host files from ring 3 there, handing out the lowest free number
//! under the table's lock, so numbers stay Linux's whoever hands them out. The kernel takes
//! the lock for every use of its own table, first taking in what the host changed.

use crate::arch::sync::{SpinGuard, SpinLock};
use crate::fs::Node;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use enclave_proto::slots::{
    RING3_FDS, RING3_FD_CHANGED, RING3_FD_CLOEXEC, RING3_FD_ENTRIES, RING3_FD_KERNEL, RING3_FD_LOCK, RING3_FD_SOLE, RING3_FD_STATUS_MASK,
    RING3_FD_STATUS_SHIFT, RING3_FD_TABLE_SIZE,
};

pub enum Descriptor {
    /// 0, 1 and 2: standard input (always at end of file) and the console.
    Console,
    File {
        node: Node,
        offset: u64,
    },
    Directory {
        path: String,
        node: Node,
        position: usize,
    },
    /// A file on the host (a persistent enclave's job): `handle` is the host's number for it,
    /// `status_flags` the access mode and status flags it was opened with (`F_GETFL`).
    Remote {
        handle: u32,
        status_flags: u32,
    },
    /// `/dev/xpmem` (`crate::xpmem`): only ioctl does anything.
    Xpmem,
    /// XEMEM's notification descriptor for a segment (`xemem_notify_fd`): read takes the
    /// count of signals since the last read (eventfd semantics, `crate::xpmem::Notifier`).
    XpmemNotify {
        notifier: alloc::sync::Arc<crate::xpmem::Notifier>,
        non_blocking: bool,
    },
    /// One end of a pipe (`super::pipe`).
    Pipe(super::pipe::PipeEnd),
    /// An epoll instance (`epoll_create1`, `super::epoll`).
    Epoll(Arc<super::epoll::Epoll>),
    /// A socket the host holds for the job (`crate::net`); closed there with its last descriptor.
    Socket(Arc<crate::net::Socket>),
}

/// A file descriptor number as Linux declares it (a C `int`: the low 32 bits of a register).
/// Negative numbers name nothing (or, for the `*at` calls, AT_FDCWD).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fd(pub i32);

/// A descriptor as a system call returns it.
impl From<Fd> for u64 {
    fn from(fd: Fd) -> u64 {
        fd.0 as u32 as u64
    }
}

impl Fd {
    /// Its slot in the table (negative numbers fall past the end: not open).
    fn index(self) -> usize {
        self.0 as u32 as usize
    }
}

/// Linux's default RLIMIT_NOFILE.
pub const MAX_DESCRIPTORS: usize = 1024;

pub type OpenFile = Arc<SpinLock<Descriptor>>;

#[derive(Clone)]
struct Slot {
    file: OpenFile,
    close_on_exec: bool,
}

pub struct Descriptors {
    table: Vec<Option<Slot>>,
    /// The table shared with the host (`RING3_FD_TABLE_SIZE` bytes as words), once the
    /// process has reached the host.
    shared: Option<Arc<[AtomicU64]>>,
    /// Its entries as the kernel last wrote or read them: an entry that differs was changed by
    /// the host (a close and an open may both have happened since).
    known: Vec<u64>,
}

const LOCK: usize = (RING3_FD_LOCK / 8) as usize;
const CHANGED: usize = (RING3_FD_CHANGED / 8) as usize;
const ENTRIES: usize = (RING3_FD_ENTRIES / 8) as usize;
/// The lock word's value while the kernel holds it.
const KERNEL_HOLDS: u64 = 1;

/// What the host's table says of `slot`.
fn entry_of(slot: &Option<Slot>) -> u64 {
    let Some(slot) = slot else { return 0 };
    match *slot.file.lock() {
        Descriptor::Remote { handle, status_flags } if handle != u32::MAX => {
            let sole = if Arc::strong_count(&slot.file) == 1 { RING3_FD_SOLE } else { 0 };
            let cloexec = if slot.close_on_exec { RING3_FD_CLOEXEC } else { 0 };
            (handle as u64 + 1) | sole | cloexec | ((status_flags as u64 & RING3_FD_STATUS_MASK) << RING3_FD_STATUS_SHIFT)
        }
        _ => RING3_FD_KERNEL,
    }
}

/// The descriptor a host-made entry stands for.
fn slot_of(entry: u64) -> Slot {
    let handle = (entry as u32).wrapping_sub(1);
    let status_flags = ((entry >> RING3_FD_STATUS_SHIFT) & RING3_FD_STATUS_MASK) as u32;
    Slot { file: Arc::new(SpinLock::new(Descriptor::Remote { handle, status_flags })), close_on_exec: entry & RING3_FD_CLOEXEC != 0 }
}

/// The host's entry at `index` says a host file (what only the host writes, besides the kernel's
/// own host files).
fn is_host_file(entry: u64) -> bool {
    entry != 0 && entry & RING3_FD_KERNEL == 0
}

impl Descriptors {
    pub fn new() -> Descriptors {
        Descriptors {
            table: (0..3).map(|_| Some(Slot { file: Arc::new(SpinLock::new(Descriptor::Console)), close_on_exec: false })).collect(),
            shared: None,
            known: Vec::new(),
        }
    }

    /// The table shared with the host (a kernel address), made now if there is none yet.
    pub fn host_handle_table(&mut self) -> u64 {
        if self.shared.is_none() {
            let words = (RING3_FD_TABLE_SIZE / 8) as usize;
            let table: Arc<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
            self.known = (0..RING3_FDS as usize).map(|index| self.table.get(index).map_or(0, entry_of)).collect();
            for (index, entry) in self.known.iter().enumerate() {
                table[ENTRIES + index].store(*entry, Ordering::Relaxed);
            }
            self.shared = Some(table);
        }
        self.shared.as_ref().map_or(0, |table| table.as_ptr() as u64)
    }

    /// Runs `f` on the table with the host's table locked, after taking in what the host
    /// opened (a new host-file descriptor) and closed (a descriptor gone) meanwhile.
    fn locked<R>(&mut self, f: impl FnOnce(&mut Descriptors) -> R) -> R {
        let Some(shared) = self.shared.clone() else { return f(self) };
        while shared[LOCK].compare_exchange(0, KERNEL_HOLDS, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            core::hint::spin_loop();
        }
        if shared[CHANGED].swap(0, Ordering::SeqCst) != 0 {
            for index in 0..RING3_FDS as usize {
                let entry = shared[ENTRIES + index].load(Ordering::SeqCst);
                if entry == self.known[index] {
                    continue;
                }
                self.known[index] = entry;
                // The host closes only host files nothing else shares, and opens only at free
                // numbers: what the kernel had there is gone.
                if self.table.len() <= index {
                    self.table.resize(index + 1, None);
                }
                self.table[index] = is_host_file(entry).then(|| slot_of(entry));
            }
        }
        let result = f(self);
        shared[LOCK].store(0, Ordering::SeqCst);
        result
    }

    /// Tells the host's table what `index` now holds (the caller holds its lock).
    fn publish(&mut self, index: usize) {
        if let (Some(shared), true) = (&self.shared, index < RING3_FDS as usize) {
            let entry = self.table.get(index).map_or(0, entry_of);
            shared[ENTRIES + index].store(entry, Ordering::SeqCst);
            self.known[index] = entry;
        }
    }

    /// The open file `descriptor` names, without taking the host's lock (the caller holds it).
    fn file_at(&self, descriptor: Fd) -> Option<OpenFile> {
        Some(self.table.get(descriptor.index())?.as_ref()?.file.clone())
    }

    fn slot(&mut self, descriptor: Fd) -> Option<&mut Slot> {
        self.locked(|_| ());
        self.table.get_mut(descriptor.index())?.as_mut()
    }

    pub fn get(&mut self, descriptor: Fd) -> Option<SpinGuard<'_, Descriptor>> {
        Some(self.slot(descriptor)?.file.lock())
    }

    /// The size of Linux's table for these descriptors (64, doubled as higher numbers are
    /// used; `select` reads no bits past it).
    pub fn linux_table_size(&mut self) -> usize {
        self.locked(|_| ());
        self.table.len().max(64).next_power_of_two().min(MAX_DESCRIPTORS)
    }

    /// The open file `descriptor` names (for epoll, which watches open files): shared from
    /// now on, so the host no longer closes it from ring 3.
    pub fn open_file(&mut self, descriptor: Fd) -> Option<OpenFile> {
        self.locked(|descriptors| {
            let file = descriptors.file_at(descriptor)?;
            descriptors.publish(descriptor.index());
            Some(file)
        })
    }

    /// FD_CLOEXEC of `descriptor`, `None` if it is not open.
    pub fn close_on_exec(&mut self, descriptor: Fd) -> Option<bool> {
        Some(self.slot(descriptor)?.close_on_exec)
    }

    pub fn set_close_on_exec(&mut self, descriptor: Fd, close_on_exec: bool) -> Option<()> {
        self.locked(|descriptors| {
            descriptors.table.get_mut(descriptor.index())?.as_mut()?.close_on_exec = close_on_exec;
            descriptors.publish(descriptor.index());
            Some(())
        })
    }

    /// `execve`: closes the descriptors marked close-on-exec; returns their open files, to be
    /// dropped once the caller holds no lock (a pipe's last end wakes its waiters).
    pub fn close_marked(&mut self) -> Vec<OpenFile> {
        self.locked(|descriptors| {
            let mut closed = Vec::new();
            for index in 0..descriptors.table.len() {
                if descriptors.table[index].as_ref().is_some_and(|slot| slot.close_on_exec) {
                    closed.extend(descriptors.table[index].take().map(|slot| slot.file));
                    descriptors.publish(index);
                }
            }
            closed
        })
    }

    /// `fork`'s copy: the same open files under the same numbers and flags. Every host file is
    /// shared from then on, in both processes' tables.
    pub fn fork(&mut self) -> Descriptors {
        self.locked(|descriptors| {
            let child = Descriptors { table: descriptors.table.clone(), shared: None, known: Vec::new() };
            (0..descriptors.table.len()).for_each(|index| descriptors.publish(index));
            child
        })
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
    pub fn insert(&mut self, entry: Descriptor) -> Option<Fd> {
        self.insert_flagged(entry, false)
    }

    /// `insert`, with the close-on-exec flag (O_CLOEXEC) given.
    pub fn insert_flagged(&mut self, entry: Descriptor, close_on_exec: bool) -> Option<Fd> {
        self.locked(|descriptors| {
            let index = descriptors.free_slot(0)?;
            descriptors.table[index] = Some(Slot { file: Arc::new(SpinLock::new(entry)), close_on_exec });
            descriptors.publish(index);
            Some(Fd(index as i32))
        })
    }

    /// `dup`: a new number, at least `lowest`, for the same open file; `None` when `from` is
    /// not open (or the table is full: `Err`).
    pub fn duplicate(&mut self, from: Fd, lowest: u64, close_on_exec: bool) -> Result<Fd, DuplicateError> {
        self.locked(|descriptors| {
            let file = descriptors.file_at(from).ok_or(DuplicateError::NotOpen)?;
            let index = descriptors.free_slot(lowest as usize).ok_or(DuplicateError::TableFull)?;
            descriptors.table[index] = Some(Slot { file, close_on_exec });
            descriptors.publish(index);
            descriptors.publish(from.index());
            Ok(Fd(index as i32))
        })
    }

    /// `dup2`: makes `to` name the open file of `from`, closing what `to` named (returned, to
    /// be dropped unlocked).
    pub fn duplicate_to(&mut self, from: Fd, to: Fd, close_on_exec: bool) -> Result<(Fd, Option<OpenFile>), DuplicateError> {
        self.locked(|descriptors| {
            let file = descriptors.file_at(from).ok_or(DuplicateError::NotOpen)?;
            let to = to.index();
            if to >= MAX_DESCRIPTORS {
                return Err(DuplicateError::TableFull);
            }
            if descriptors.table.len() <= to {
                descriptors.table.resize(to + 1, None);
            }
            let replaced = descriptors.table[to].replace(Slot { file, close_on_exec });
            descriptors.publish(to);
            descriptors.publish(from.index());
            Ok((Fd(to as i32), replaced.map(|slot| slot.file)))
        })
    }

    /// Closes `descriptor`; returns its open file, to be dropped unlocked.
    pub fn remove(&mut self, descriptor: Fd) -> Option<OpenFile> {
        self.locked(|descriptors| {
            let file = descriptors.table.get_mut(descriptor.index())?.take().map(|slot| slot.file)?;
            descriptors.publish(descriptor.index());
            Some(file)
        })
    }
}

pub enum DuplicateError {
    NotOpen,
    TableFull,
}
