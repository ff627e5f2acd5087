//! A job's memory, Kitten-style: three physically contiguous regions reserved at load (image,
//! stack, heap), each at a fixed virtual-to-physical offset. `brk` grows up from the bottom
//! of the heap region and anonymous `mmap` carves from its top; page tables are filled when
//! memory is handed out and cleared when it is given back, never on demand.
//!
//! Heap memory given back is not cleared at once but marked dirty, and `mmap` prefers clean
//! memory: clearing is kernel work (about 40 ms per MiB when kernel code is emulated, as on
//! PVM), and with a heap of most of the machine a job rarely needs to reuse anything.

use crate::arch::paging::{OutOfMemory, Protection, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::phys;
use crate::mm::aspace::AddressSpace;
use crate::mm::ranges::{Range, RangeSet};
use alloc::boxed::Box;
use alloc::vec::Vec;

#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub physical_start: u64,
}

impl Region {
    fn contains(&self, start: u64, end: u64) -> bool {
        self.start <= start && end <= self.end
    }

    fn physical(&self, address: u64) -> u64 {
        self.physical_start + (address - self.start)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum MemoryError {
    /// No room, or a range that is not (entirely) mapped.
    NoMemory,
    InvalidArgument,
}

impl From<OutOfMemory> for MemoryError {
    fn from(_: OutOfMemory) -> Self {
        MemoryError::NoMemory
    }
}

/// `None` is PROT_NONE: reserved but inaccessible.
pub type Access = Option<Protection>;

/// How many separate free (and dirty) pieces the heap can be in; a `munmap` that would make
/// more fails with EINVAL (ENOMEM for `mmap`).
const HEAP_RANGES: usize = 256;

pub const READ_WRITE: Protection = Protection { write: true, execute: false };

pub struct JobMemory {
    pub aspace: AddressSpace,
    pub image: Region,
    /// The physical page behind each page of the image: its block (`image.physical`), or, for
    /// read-only segments, the page of the executable file itself (not copied).
    image_pages: Vec<u64>,
    pub stack: Region,
    pub heap: Region,
    /// Parts of the heap region neither in the brk area nor mapped by `mmap`.
    heap_free: Box<RangeSet<HEAP_RANGES>>,
    /// The parts of `heap_free` that were used and are not yet cleared.
    heap_dirty: Box<RangeSet<HEAP_RANGES>>,
    brk_start: u64,
    brk: u64,
}

fn page_up(value: u64) -> u64 {
    value.next_multiple_of(PAGE_SIZE)
}

impl JobMemory {
    pub fn new(aspace: AddressSpace, image: Region, image_pages: Vec<u64>, stack: Region, heap: Region) -> JobMemory {
        let mut heap_free = Box::new(RangeSet::new());
        // A fresh set has room for one range.
        let _ = heap_free.insert(heap.start, heap.end);
        let heap_dirty = Box::new(RangeSet::new());
        JobMemory { aspace, image, image_pages, stack, heap, heap_free, heap_dirty, brk_start: heap.start, brk: heap.start }
    }

    fn map_heap(&mut self, start: u64, end: u64, access: Access) -> Result<(), MemoryError> {
        match access {
            Some(protection) => self.aspace.map(start, self.heap.physical(start), end - start, protection)?,
            None => self.aspace.unmap(start, end - start)?,
        }
        Ok(())
    }

    /// Unmaps heap pages and gives them back; the ones that were in use become dirty.
    fn release_heap(&mut self, start: u64, end: u64) -> Result<(), MemoryError> {
        self.aspace.unmap(start, end - start)?;
        let used: Vec<Range> = self.heap_free.gaps(start, end).collect();
        for range in used {
            self.heap_dirty.insert(range.start, range.end).map_err(|_| MemoryError::NoMemory)?;
        }
        self.heap_free.insert(start, end).map_err(|_| MemoryError::NoMemory)
    }

    /// Takes `[start, end)` (free) out of the heap's free memory, clearing its dirty parts.
    fn claim(&mut self, start: u64, end: u64) -> Result<(), MemoryError> {
        self.heap_free.remove(start, end).map_err(|_| MemoryError::NoMemory)?;
        let dirty: Vec<Range> = self.heap_dirty.ranges().iter().copied().filter(|r| r.start < end && r.end > start).collect();
        for range in dirty {
            let (from, to) = (range.start.max(start), range.end.min(end));
            phys::zero(self.heap.physical(from), (to - from) as usize);
        }
        self.heap_dirty.remove(start, end).map_err(|_| MemoryError::NoMemory)
    }

    /// The highest `len` bytes of free heap aligned to `align`, clean ones if possible.
    fn find_free(&self, len: u64, align: u64) -> Option<u64> {
        let fit = |range: &Range| {
            let start = range.end.checked_sub(len)? / align * align;
            (start >= range.start).then_some(start)
        };
        let clean = self.heap_free.ranges().iter().rev().find_map(|free| {
            let clean_parts: Vec<Range> = self.heap_dirty.gaps(free.start, free.end).collect();
            clean_parts.iter().rev().find_map(fit)
        });
        clean.or_else(|| self.heap_free.ranges().iter().rev().find_map(fit))
    }

    /// Clears the heap's used memory (in use, or given back dirty) and returns the heap's
    /// physical range, now all zero: a persistent enclave gives it back after the job.
    pub fn clear_heap(&mut self) -> (u64, u64) {
        let clean: Vec<Range> = self.heap_free.ranges().iter().flat_map(|free| self.heap_dirty.gaps(free.start, free.end).collect::<Vec<_>>()).collect();
        let mut position = self.heap.start;
        for range in clean.iter().chain(core::iter::once(&Range { start: self.heap.end, end: self.heap.end })) {
            if range.start > position {
                phys::zero(self.heap.physical(position), (range.start - position) as usize);
            }
            position = position.max(range.end);
        }
        (self.heap.physical_start, self.heap.end - self.heap.start)
    }

    /// Linux `brk`: returns the (possibly unchanged) break.
    pub fn set_brk(&mut self, requested: u64) -> u64 {
        if requested < self.brk_start {
            return self.brk;
        }
        let (old_end, new_end) = (page_up(self.brk), page_up(requested));
        let changed = if new_end > old_end {
            self.heap_free.contains(old_end, new_end)
                && self.claim(old_end, new_end).is_ok()
                && self.map_heap(old_end, new_end, Some(READ_WRITE)).is_ok()
        } else {
            new_end == old_end || self.release_heap(new_end, old_end).is_ok()
        };
        if changed {
            self.brk = requested;
        }
        self.brk
    }

    /// Anonymous `mmap`: at `fixed` (replacing what is there) or wherever it fits, 2 MiB
    /// aligned when it is that large so it gets 2 MiB pages.
    pub fn map_anonymous(&mut self, len: u64, access: Access, fixed: Option<u64>) -> Result<u64, MemoryError> {
        if len == 0 {
            return Err(MemoryError::InvalidArgument);
        }
        let len = page_up(len);
        let start = match fixed {
            Some(address) => {
                let end = address.checked_add(len).ok_or(MemoryError::NoMemory)?;
                if address % PAGE_SIZE != 0 {
                    return Err(MemoryError::InvalidArgument);
                }
                let overlaps_brk_area = address < page_up(self.brk) && end > self.brk_start;
                if !self.heap.contains(address, end) || overlaps_brk_area {
                    return Err(MemoryError::NoMemory);
                }
                self.release_heap(address, end)?;
                self.claim(address, end)?;
                address
            }
            None => {
                let align = if len >= HUGE_PAGE_SIZE { HUGE_PAGE_SIZE } else { PAGE_SIZE };
                let start = self.find_free(len, align).ok_or(MemoryError::NoMemory)?;
                self.claim(start, start + len)?;
                start
            }
        };
        self.map_heap(start, start + len, access)?;
        Ok(start)
    }

    /// Copies `bytes` into heap memory at `start` (mapped by this job: a file mapping being
    /// filled).
    pub fn fill_heap(&mut self, start: u64, bytes: &[u8]) {
        phys::bytes_mut(self.heap.physical(start), bytes.len()).copy_from_slice(bytes);
    }

    /// `munmap`: heap memory goes back to the heap; in the image and stack only the pages
    /// disappear (their memory stays reserved to the job).
    pub fn unmap(&mut self, start: u64, len: u64) -> Result<(), MemoryError> {
        if !start.is_multiple_of(PAGE_SIZE) || len == 0 {
            return Err(MemoryError::InvalidArgument);
        }
        let end = start.checked_add(page_up(len)).ok_or(MemoryError::InvalidArgument)?;
        let heap_start = start.clamp(self.heap.start, self.heap.end);
        let heap_end = end.clamp(self.heap.start, self.heap.end);
        if heap_start < heap_end {
            self.release_heap(heap_start, heap_end)?;
        }
        self.aspace.unmap(start, end - start)?;
        Ok(())
    }

    /// `mprotect`: every page of the range must be in use.
    pub fn protect(&mut self, start: u64, len: u64, access: Access) -> Result<(), MemoryError> {
        if !start.is_multiple_of(PAGE_SIZE) {
            return Err(MemoryError::InvalidArgument);
        }
        let end = start.checked_add(page_up(len)).ok_or(MemoryError::NoMemory)?;
        let region = [self.image, self.stack, self.heap]
            .into_iter()
            .find(|region| region.contains(start, end))
            .ok_or(MemoryError::NoMemory)?;
        if start == end {
            return Ok(());
        }
        if region.start == self.heap.start && !self.heap_free.is_disjoint(start, end) {
            return Err(MemoryError::NoMemory);
        }
        match access {
            Some(protection) if region.start == self.image.start => {
                // Runs of pages that are physically contiguous keep their backing.
                let mut address = start;
                while address < end {
                    let page = ((address - self.image.start) / PAGE_SIZE) as usize;
                    let physical = self.image_pages[page];
                    let mut run_end = address + PAGE_SIZE;
                    while run_end < end && self.image_pages[((run_end - self.image.start) / PAGE_SIZE) as usize] == physical + (run_end - address) {
                        run_end += PAGE_SIZE;
                    }
                    self.aspace.map(address, physical, run_end - address, protection)?;
                    address = run_end;
                }
            }
            Some(protection) => self.aspace.map(start, region.physical(start), end - start, protection)?,
            None => self.aspace.unmap(start, end - start)?,
        }
        Ok(())
    }

    /// MADV_DONTNEED: heap and stack pages in the range stay mapped but read back as zero.
    pub fn discard(&mut self, start: u64, len: u64) {
        let end = start.saturating_add(page_up(len));
        for region in [self.stack, self.heap] {
            let (from, to) = (start.clamp(region.start, region.end), end.clamp(region.start, region.end));
            if from < to {
                let in_use: Vec<Range> = if region.start == self.heap.start {
                    self.heap_free.gaps(from, to).collect()
                } else {
                    alloc::vec![Range { start: from, end: to }]
                };
                for range in in_use {
                    phys::zero(region.physical(range.start), range.len() as usize);
                }
            }
        }
    }

    /// `mremap` of a heap mapping: shrinks in place, grows in place when the pages above are
    /// free, otherwise moves (copying) if allowed.
    pub fn remap(&mut self, start: u64, old_len: u64, new_len: u64, may_move: bool) -> Result<u64, MemoryError> {
        let (old_len, new_len) = (page_up(old_len), page_up(new_len));
        if !start.is_multiple_of(PAGE_SIZE) || new_len == 0 {
            return Err(MemoryError::InvalidArgument);
        }
        let old_end = start.checked_add(old_len).ok_or(MemoryError::NoMemory)?;
        if !self.heap.contains(start, old_end) || !self.heap_free.is_disjoint(start, old_end) {
            return Err(MemoryError::NoMemory);
        }
        if new_len <= old_len {
            if new_len < old_len {
                self.release_heap(start + new_len, old_end)?;
            }
            return Ok(start);
        }
        let new_end = start + new_len;
        if self.heap.contains(start, new_end) && self.heap_free.contains(old_end, new_end) {
            self.claim(old_end, new_end)?;
            self.map_heap(old_end, new_end, Some(READ_WRITE))?;
            return Ok(start);
        }
        if !may_move {
            return Err(MemoryError::NoMemory);
        }
        let moved = self.map_anonymous(new_len, Some(READ_WRITE), None)?;
        phys::bytes_mut(self.heap.physical(moved), old_len as usize)
            .copy_from_slice(phys::bytes(self.heap.physical(start), old_len as usize));
        self.release_heap(start, old_end)?;
        Ok(moved)
    }
}
