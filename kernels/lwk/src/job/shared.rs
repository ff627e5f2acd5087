//! Shared memory: `mmap(MAP_SHARED | MAP_ANONYMOUS)` gets a physically contiguous block of its
//! own, outside the heap, that `fork` maps into the child at the same address instead of
//! copying, so that parent and children see each other's writes as on Linux (MPI libraries and
//! shared-memory runtimes rely on it); it goes back, cleared, when its last mapping in any
//! process is gone. `mmap(MAP_SHARED)` of a host file (a `/dev/shm` file, `shm_open`) maps the
//! file's own pages, which the host adds as a guest-physical region (`FileOp::MapShared`), so
//! that processes in other enclaves and on the host share them too; the region goes when no
//! process of the job maps it. When the host truncates such a file, it says which tail of the
//! region went away (`HostMessage::SharedFileTruncated`): those pages are unmapped from every
//! mapping of the region and never mapped again, so the job's next touch there is `SIGBUS`
//! (`BUS_ADRERR`), as on Linux.
//!
//! The mappings live in a window of their own, between any heap the loader places (below
//! 0x5600_0000_0000, see `xpmem`) and XPMEM's attachment window (from 0x7000_0000_0000), so
//! that they never meet the heap's bookkeeping (`job::memory`).

use super::memory::{Access, MemoryError};
use crate::arch::paging::{HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::console::log;
use crate::enclave::files;
use crate::mm::aspace::AddressSpace;
use crate::mm::pmem;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

pub const WINDOW_START: u64 = 0x6000_0000_0000;
pub const WINDOW_END: u64 = 0x7000_0000_0000;

/// Whether `[start, end)` touches the window.
pub fn in_window(start: u64, end: u64) -> bool {
    start < WINDOW_END && end > WINDOW_START
}

/// Physical memory shared by every mapping that holds it: the kernel's, or a host file's
/// pages the host added as a region (`mmap(MAP_SHARED)` of a host file).
struct Block {
    physical: u64,
    len: u64,
    host_file: bool,
    /// The host added it read-only (the file is not open for writing): never mapped writable.
    read_only: bool,
    /// Bytes from `physical` still backed: `len`, less once the host file was truncated under
    /// the region. Pages past it are never mapped; a touch there is SIGBUS.
    backed: AtomicU64,
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.host_file {
            // Once the job has ended the host removes its regions itself.
            if files::job_cwd().is_some() {
                let result = files::unmap_shared(self.physical);
                if result < 0 {
                    log!("mmap: the host did not remove the shared file region at {:#x} (errno {})", self.physical, -result);
                }
            }
            return;
        }
        // In a persistent enclave the host clears large blocks at native speed.
        crate::enclave::zero_memory(self.physical, self.len);
        pmem::free_clean(self.physical, self.len);
    }
}

#[derive(Clone)]
struct Mapping {
    start: u64,
    end: u64,
    block: Arc<Block>,
    /// Where `start` lies in the block.
    offset: u64,
    access: Access,
}

impl Mapping {
    fn physical(&self, address: u64) -> u64 {
        self.block.physical + self.offset + (address - self.start)
    }

    /// The part of the mapping within `[start, end)` (which must meet it).
    fn part(&self, start: u64, end: u64) -> Mapping {
        let (from, to) = (start.max(self.start), end.min(self.end));
        Mapping { start: from, end: to, block: self.block.clone(), offset: self.offset + (from - self.start), access: self.access }
    }

    /// Where the block's backed pages end within the mapping (`end` when all are backed).
    fn backed_end(&self) -> u64 {
        let backed = self.block.backed.load(Ordering::Acquire);
        if backed >= self.offset + (self.end - self.start) {
            self.end
        } else {
            self.start + backed.saturating_sub(self.offset)
        }
    }

    /// Maps the mapping's backed pages (a truncated host file's tail stays unmapped).
    fn map_into(&self, aspace: &mut AddressSpace) -> Result<(), MemoryError> {
        let backed_end = self.backed_end();
        match self.access {
            Some(protection) if backed_end > self.start => {
                aspace.map(self.start, self.physical(self.start), backed_end - self.start, protection)?
            }
            Some(_) => {}
            None => aspace.unmap(self.start, self.end - self.start)?,
        }
        Ok(())
    }
}

fn page_multiple(len: u64) -> Result<u64, MemoryError> {
    len.checked_next_multiple_of(PAGE_SIZE).filter(|&len| len != 0).ok_or(MemoryError::InvalidArgument)
}

/// Mappings taken out of a process (`unmap`), to be dropped once no lock is held: their
/// blocks may be cleared by the host, which takes a round trip.
#[must_use]
pub struct Released {
    _held: Vec<Mapping>,
}

/// A process's shared mappings, in address order.
#[derive(Default)]
pub struct SharedMappings {
    mappings: Vec<Mapping>,
}

impl SharedMappings {
    /// A new zeroed mapping of `len` bytes with `access`, at `fixed` (which must lie in the
    /// window: whatever is mapped there goes) or at the lowest free place. 2 MiB aligned from
    /// 2 MiB on, so that large pages map it.
    pub fn map_new(
        &mut self,
        aspace: &mut AddressSpace,
        len: u64,
        access: Access,
        fixed: Option<u64>,
    ) -> Result<(u64, Released), MemoryError> {
        let len = page_multiple(len)?;
        let align = if len >= HUGE_PAGE_SIZE { HUGE_PAGE_SIZE } else { PAGE_SIZE };
        let (start, released) = self.place(aspace, len, align, fixed)?;
        let physical = pmem::allocate(len, align).ok_or(MemoryError::NoMemory)?;
        let block = Arc::new(Block { physical, len, host_file: false, read_only: false, backed: AtomicU64::new(len) });
        self.insert(aspace, Mapping { start, end: start + len, block, offset: 0, access })?;
        Ok((start, released))
    }

    /// A mapping of the host file region at guest-physical `gpa` (`len` bytes, from
    /// `files::map_shared`), placed as `map_new` places memory; the region goes when no
    /// process maps any of it.
    pub fn map_host_file(
        &mut self,
        aspace: &mut AddressSpace,
        gpa: u64,
        len: u64,
        access: Access,
        fixed: Option<u64>,
    ) -> Result<(u64, Released), MemoryError> {
        // Made first, so that the region goes back whatever fails below.
        let read_only = !access.is_some_and(|protection| protection.write);
        let block = Arc::new(Block { physical: gpa, len, host_file: true, read_only, backed: AtomicU64::new(len) });
        let len = page_multiple(len)?;
        // 2 MiB pages where the region's address allows them.
        let align = if len >= HUGE_PAGE_SIZE && gpa.is_multiple_of(HUGE_PAGE_SIZE) { HUGE_PAGE_SIZE } else { PAGE_SIZE };
        let (start, released) = self.place(aspace, len, align, fixed)?;
        self.insert(aspace, Mapping { start, end: start + len, block, offset: 0, access })?;
        Ok((start, released))
    }

    /// Where a new mapping of `len` bytes goes: at `fixed` (which must lie in the window:
    /// whatever is mapped there goes) or at the lowest free `align`ed place.
    fn place(&mut self, aspace: &mut AddressSpace, len: u64, align: u64, fixed: Option<u64>) -> Result<(u64, Released), MemoryError> {
        match fixed {
            Some(start) => {
                let end = start.checked_add(len).ok_or(MemoryError::InvalidArgument)?;
                if !start.is_multiple_of(PAGE_SIZE) || start < WINDOW_START || end > WINDOW_END {
                    return Err(MemoryError::InvalidArgument);
                }
                Ok((start, self.unmap(aspace, start, end)?))
            }
            None => Ok((self.free_place(len, align).ok_or(MemoryError::NoMemory)?, Released { _held: Vec::new() })),
        }
    }

    /// Maps `mapping` (placed by `place`) and records it; on failure its block goes back.
    fn insert(&mut self, aspace: &mut AddressSpace, mapping: Mapping) -> Result<(), MemoryError> {
        mapping.map_into(aspace)?;
        let at = self.mappings.partition_point(|other| other.start < mapping.start);
        self.mappings.insert(at, mapping);
        Ok(())
    }

    /// The lowest `align`ed start of `len` free bytes in the window.
    fn free_place(&self, len: u64, align: u64) -> Option<u64> {
        let mut candidate = WINDOW_START;
        for mapping in &self.mappings {
            if candidate + len <= mapping.start {
                break;
            }
            candidate = candidate.max(mapping.end.next_multiple_of(align));
        }
        (candidate + len <= WINDOW_END).then_some(candidate)
    }

    /// Whether any mapping meets `[start, end)`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.mappings.iter().any(|mapping| mapping.start < end && start < mapping.end)
    }

    /// `munmap` of `[start, end)`: the pages disappear from this process; a block goes when no
    /// process maps any of it (once the caller drops what this returns).
    pub fn unmap(&mut self, aspace: &mut AddressSpace, start: u64, end: u64) -> Result<Released, MemoryError> {
        let mut kept = Vec::with_capacity(self.mappings.len() + 1);
        let mut released = Vec::new();
        for mapping in self.mappings.drain(..) {
            if mapping.end <= start || end <= mapping.start {
                kept.push(mapping);
                continue;
            }
            if mapping.start < start {
                kept.push(mapping.part(mapping.start, start));
            }
            if end < mapping.end {
                kept.push(mapping.part(end, mapping.end));
            }
            released.push(mapping);
        }
        self.mappings = kept;
        aspace.unmap(start, end - start)?;
        Ok(Released { _held: released })
    }

    /// `mprotect` of `[start, end)`, every page of which must be mapped here.
    pub fn protect(&mut self, aspace: &mut AddressSpace, start: u64, end: u64, access: Access) -> Result<(), MemoryError> {
        let mut covered = start;
        for mapping in self.mappings.iter().filter(|mapping| mapping.start < end && start < mapping.end) {
            if mapping.start > covered {
                break;
            }
            covered = mapping.end;
        }
        if covered < end {
            return Err(MemoryError::NoMemory);
        }
        let touched = || self.mappings.iter().filter(|mapping| mapping.start < end && start < mapping.end);
        if access.is_some_and(|protection| protection.write) && touched().any(|mapping| mapping.block.read_only) {
            // The region is read-only on the host too: a write would not reach the file.
            log!("mprotect: a shared mapping of a file not open for writing cannot be made writable");
            return Err(MemoryError::InvalidArgument);
        }
        let mut changed = Vec::with_capacity(self.mappings.len() + 2);
        for mapping in self.mappings.drain(..) {
            if mapping.end <= start || end <= mapping.start {
                changed.push(mapping);
                continue;
            }
            if mapping.start < start {
                changed.push(mapping.part(mapping.start, start));
            }
            let mut middle = mapping.part(start, end);
            middle.access = access;
            changed.push(middle);
            if end < mapping.end {
                changed.push(mapping.part(end, mapping.end));
            }
        }
        self.mappings = changed;
        for mapping in self.mappings.iter().filter(|mapping| mapping.start < end && start < mapping.end) {
            mapping.map_into(aspace)?;
        }
        Ok(())
    }

    /// The host file region holding guest-physical `[gpa, gpa + len)` lost its pages from
    /// there on (its file was truncated on the host): they are unmapped from this process's
    /// mappings of it, and a touch there is SIGBUS from now on. Whether any page was mapped.
    pub fn host_file_truncated(&mut self, aspace: &mut AddressSpace, gpa: u64, len: u64) -> bool {
        let end = gpa.saturating_add(len);
        let mut unmapped = false;
        for mapping in &self.mappings {
            let block = &mapping.block;
            if !block.host_file || end <= block.physical || block.physical + block.len <= gpa {
                continue;
            }
            block.backed.fetch_min(gpa.saturating_sub(block.physical), Ordering::AcqRel);
            let from = mapping.backed_end();
            if from < mapping.end && mapping.access.is_some() {
                // Splitting a 2 MiB page takes a table page; without one the tail stays mapped
                // over the host's zero pages (`memory` in the VMM), which the job then reads.
                if aspace.unmap(from, mapping.end - from).is_err() {
                    log!("mmap: no memory to unmap the tail of a truncated host file at {from:#x}: it reads as zeros");
                }
                unmapped = true;
            }
        }
        unmapped
    }

    /// Whether `address` lies in a page of a host file mapping past the file's end (a touch
    /// there is SIGBUS, not SIGSEGV).
    pub fn is_past_file_end(&self, address: u64) -> bool {
        self.mappings.iter().any(|mapping| mapping.start <= address && address < mapping.end && address >= mapping.backed_end())
    }

    /// The same mappings in a forked child's address space `aspace`, over the same blocks.
    pub fn fork_into(&self, aspace: &mut AddressSpace) -> Result<SharedMappings, MemoryError> {
        for mapping in &self.mappings {
            mapping.map_into(aspace)?;
        }
        Ok(SharedMappings { mappings: self.mappings.clone() })
    }
}
