//! A process's file descriptors: the console streams, files of the in-memory file system,
//! host files, pipes. Like Linux's, a descriptor names an open file description: `dup` and
//! `fork` share it, offset included; the close-on-exec flag is the descriptor's own.

use crate::arch::sync::{SpinGuard, SpinLock};
use crate::fs::Node;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};
use enclave_proto::slots::RING3_FDS;

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

/// `Clone` is `fork`'s copy: the same open files under the same numbers and flags.
#[derive(Clone)]
pub struct Descriptors {
    table: Vec<Option<Slot>>,
    host_handles: HostHandles,
}

/// The host handle (+ 1) behind each of the first `RING3_FDS` descriptors, 0 for any other
/// kind: the table the host reads to serve the job's ring-3 file calls
/// (`crate::enclave::slots`), kept by the kernel alone. Allocated with the first host file.
struct HostHandles(Option<Box<[AtomicU32]>>);

impl Clone for HostHandles {
    fn clone(&self) -> HostHandles {
        HostHandles(self.0.as_ref().map(|table| table.iter().map(|entry| AtomicU32::new(entry.load(Ordering::Relaxed))).collect()))
    }
}

impl HostHandles {
    fn set(&mut self, index: usize, handle: Option<u32>) {
        if index >= RING3_FDS as usize || (handle.is_none() && self.0.is_none()) {
            return;
        }
        let table = self.0.get_or_insert_with(|| (0..RING3_FDS).map(|_| AtomicU32::new(0)).collect());
        table[index].store(handle.map_or(0, |handle| handle.wrapping_add(1)), Ordering::SeqCst);
    }
}

/// The host handle an open file names, if it is a host file.
fn host_handle(file: &OpenFile) -> Option<u32> {
    match *file.lock() {
        Descriptor::Remote { handle, .. } => Some(handle),
        _ => None,
    }
}

impl Descriptors {
    pub fn new() -> Descriptors {
        Descriptors {
            table: (0..3).map(|_| Some(Slot { file: Arc::new(SpinLock::new(Descriptor::Console)), close_on_exec: false })).collect(),
            host_handles: HostHandles(None),
        }
    }

    /// Where the host-handle table lies (a kernel address), if there is one yet.
    pub fn host_handle_table(&self) -> Option<u64> {
        self.host_handles.0.as_ref().map(|table| table.as_ptr() as u64)
    }

    fn slot(&mut self, descriptor: Fd) -> Option<&mut Slot> {
        self.table.get_mut(descriptor.index())?.as_mut()
    }

    pub fn get(&mut self, descriptor: Fd) -> Option<SpinGuard<'_, Descriptor>> {
        Some(self.slot(descriptor)?.file.lock())
    }

    /// The size of Linux's table for these descriptors (64, doubled as higher numbers are
    /// used; `select` reads no bits past it).
    pub fn linux_table_size(&self) -> usize {
        self.table.len().max(64).next_power_of_two().min(MAX_DESCRIPTORS)
    }

    /// The open file `descriptor` names (for epoll, which watches open files).
    pub fn open_file(&mut self, descriptor: Fd) -> Option<OpenFile> {
        Some(self.slot(descriptor)?.file.clone())
    }

    /// FD_CLOEXEC of `descriptor`, `None` if it is not open.
    pub fn close_on_exec(&mut self, descriptor: Fd) -> Option<bool> {
        Some(self.slot(descriptor)?.close_on_exec)
    }

    pub fn set_close_on_exec(&mut self, descriptor: Fd, close_on_exec: bool) -> Option<()> {
        self.slot(descriptor)?.close_on_exec = close_on_exec;
        Some(())
    }

    /// `execve`: closes the descriptors marked close-on-exec; returns their open files, to be
    /// dropped once the caller holds no lock (a pipe's last end wakes its waiters).
    pub fn close_marked(&mut self) -> Vec<OpenFile> {
        let mut closed = Vec::new();
        for (index, slot) in self.table.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|slot| slot.close_on_exec) {
                closed.extend(slot.take().map(|slot| slot.file));
                self.host_handles.set(index, None);
            }
        }
        closed
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
        let index = self.free_slot(0)?;
        let handle = match entry {
            Descriptor::Remote { handle, .. } => Some(handle),
            _ => None,
        };
        self.host_handles.set(index, handle);
        self.table[index] = Some(Slot { file: Arc::new(SpinLock::new(entry)), close_on_exec });
        Some(Fd(index as i32))
    }

    /// `dup`: a new number, at least `lowest`, for the same open file; `None` when `from` is
    /// not open (or the table is full: `Err`).
    pub fn duplicate(&mut self, from: Fd, lowest: u64, close_on_exec: bool) -> Result<Fd, DuplicateError> {
        let file = self.slot(from).map(|slot| slot.file.clone()).ok_or(DuplicateError::NotOpen)?;
        let index = self.free_slot(lowest as usize).ok_or(DuplicateError::TableFull)?;
        self.host_handles.set(index, host_handle(&file));
        self.table[index] = Some(Slot { file, close_on_exec });
        Ok(Fd(index as i32))
    }

    /// `dup2`: makes `to` name the open file of `from`, closing what `to` named (returned, to
    /// be dropped unlocked).
    pub fn duplicate_to(&mut self, from: Fd, to: Fd, close_on_exec: bool) -> Result<(Fd, Option<OpenFile>), DuplicateError> {
        let file = self.slot(from).map(|slot| slot.file.clone()).ok_or(DuplicateError::NotOpen)?;
        let to = to.index();
        if to >= MAX_DESCRIPTORS {
            return Err(DuplicateError::TableFull);
        }
        if self.table.len() <= to {
            self.table.resize(to + 1, None);
        }
        self.host_handles.set(to, host_handle(&file));
        let replaced = self.table[to].replace(Slot { file, close_on_exec });
        Ok((Fd(to as i32), replaced.map(|slot| slot.file)))
    }

    /// Closes `descriptor`; returns its open file, to be dropped unlocked.
    pub fn remove(&mut self, descriptor: Fd) -> Option<OpenFile> {
        let file = self.table.get_mut(descriptor.index())?.take().map(|slot| slot.file)?;
        self.host_handles.set(descriptor.index(), None);
        Some(file)
    }
}

pub enum DuplicateError {
    NotOpen,
    TableFull,
}
