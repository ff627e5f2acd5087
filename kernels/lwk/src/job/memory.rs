//! A job's memory, Kitten-style: three physically contiguous regions reserved at load (image,
//! stack, heap), each at a fixed virtual-to-physical offset. `brk` grows up from the bottom
//! of the heap region and anonymous `mmap` carves from its top; page tables are filled when
//! memory is handed out and cleared when it is given back, never on demand.
//!
//! Anonymous `mmap` takes the lowest free heap memory above a small area kept for `brk`
//! (`BRK_AREA`), so that what a process uses sits low in its heap: `fork` gives the child a
//! heap that ends a little above the parent's highest used byte, not a copy of the whole
//! reservation.
//!
//! Heap memory given back is not cleared at once but marked dirty, and `mmap` prefers clean
//! memory: clearing is kernel work (about 40 ms per MiB when kernel code is emulated, as on
//! PVM), and with a heap of most of the machine a job rarely needs to reuse anything.

use crate::arch::paging::{OutOfMemory, Protection, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::phys;
use crate::mm::aspace::AddressSpace;
use crate::mm::pmem;
use crate::mm::ranges::{Range, RangeSet};
use alloc::boxed::Box;
use alloc::vec::Vec;

/// Clears guest-physical `[start, start + len)`.
pub type Zero = fn(u64, u64);

/// Clears memory in this kernel.
fn clear_here(physical: u64, len: u64) {
    phys::zero(physical, len as usize);
}

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

/// The bottom of the heap kept for `brk` (a quarter of small heaps): anonymous mappings go
/// above it while there is room. glibc's malloc moves on to `mmap` when `brk` stops growing.
const BRK_AREA: u64 = 8 << 20;
/// What a forked child's heap has beyond the parent's highest used byte, for its own `brk`
/// and `mmap`, and its stack below the 2 MiB block the parent's stack pointer is in.
const CHILD_HEAP_SLACK: u64 = 4 << 20;
const CHILD_STACK_SLACK: u64 = 2 << 20;

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
    /// The end of what the `brk` area has claimed and mapped: the break rounded up to 2 MiB
    /// where that memory is clean (see `set_brk`), else to a page.
    brk_mapped: u64,
    /// Anonymous mappings are placed at or above this address when they fit.
    mmap_floor: u64,
    /// The lowest stack address the kernel wrote through its own window (a forked child's
    /// copy) or whose mapping went away (so its dirty bit is lost): `release` clears the stack
    /// from here or from its lowest written page, whichever is lower.
    stack_clear_from: u64,
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
        let mmap_floor = heap.start + BRK_AREA.min((heap.end - heap.start) / 4 / PAGE_SIZE * PAGE_SIZE);
        JobMemory {
            aspace,
            image,
            image_pages,
            stack,
            heap,
            heap_free,
            heap_dirty,
            brk_start: heap.start,
            brk: heap.start,
            brk_mapped: heap.start,
            mmap_floor,
            stack_clear_from: stack.end,
        }
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

    /// The lowest `len` free heap bytes aligned to `align` above the `brk` area (below it if
    /// nothing fits above), clean ones if possible.
    fn find_free(&self, len: u64, align: u64) -> Option<u64> {
        let fit_from = |floor: u64| {
            move |range: &Range| {
                let start = range.start.max(floor).next_multiple_of(align);
                (start.checked_add(len)? <= range.end).then_some(start)
            }
        };
        let clean_parts: Vec<Range> =
            self.heap_free.ranges().iter().flat_map(|free| self.heap_dirty.gaps(free.start, free.end).collect::<Vec<_>>()).collect();
        clean_parts
            .iter()
            .find_map(fit_from(self.mmap_floor))
            .or_else(|| self.heap_free.ranges().iter().find_map(fit_from(self.mmap_floor)))
            .or_else(|| self.heap_free.ranges().iter().find_map(fit_from(self.heap.start)))
    }

    /// Clears the heap's used memory (in use, or given back dirty) with `zero` and returns the
    /// heap's physical range, now all zero: a persistent enclave gives it back after the job.
    fn clear_heap(&mut self, zero: Zero) -> (u64, u64) {
        let clean: Vec<Range> =
            self.heap_free.ranges().iter().flat_map(|free| self.heap_dirty.gaps(free.start, free.end).collect::<Vec<_>>()).collect();
        let mut position = self.heap.start;
        for range in clean.iter().chain(core::iter::once(&Range { start: self.heap.end, end: self.heap.end })) {
            if range.start > position {
                zero(self.heap.physical(position), range.start - position);
            }
            position = position.max(range.end);
        }
        (self.heap.physical_start, self.heap.end - self.heap.start)
    }

    /// Linux `brk`: returns the (possibly unchanged) break.
    ///
    /// Past the area's first 2 MiB, growing claims and maps up to the next 2 MiB boundary when
    /// that memory is free and clean, so a large heap gets 2 MiB pages and a break that moves
    /// a little at a time (glibc's malloc asks for about 132 KiB at a time) costs kernel work
    /// once per 2 MiB rather than on every call (2 ms each on PVM: the page-table edits are
    /// emulated). The first 2 MiB grow by pages, so that a small process (a shell's child)
    /// does not have 2 MiB to clear when it ends. Shrinking gives back everything above the
    /// new break's page, as before, so memory the break takes again reads as zero (glibc's
    /// calloc relies on that).
    pub fn set_brk(&mut self, requested: u64) -> u64 {
        if requested < self.brk_start {
            return self.brk;
        }
        let (mapped, new_end) = (self.brk_mapped, page_up(requested));
        let changed = if new_end > mapped {
            let whole = new_end.next_multiple_of(HUGE_PAGE_SIZE).min(self.heap.end);
            let large = new_end - self.brk_start > HUGE_PAGE_SIZE;
            let clean = self.heap_free.contains(mapped, whole) && self.heap_dirty.is_disjoint(new_end, whole);
            let end = if large && clean && whole > new_end { whole } else { new_end };
            let grown = self.heap_free.contains(mapped, end)
                && self.claim(mapped, end).is_ok()
                && self.map_heap(mapped, end, Some(READ_WRITE)).is_ok();
            if grown {
                self.brk_mapped = end;
            }
            grown
        } else if requested < self.brk && new_end < mapped {
            let released = self.release_heap(new_end, mapped).is_ok();
            if released {
                self.brk_mapped = new_end;
            }
            released
        } else {
            true
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
                let overlaps_brk_area = address < self.brk_mapped && end > self.brk_start;
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

    /// Heap memory for a private file mapping of `len` bytes, at `fixed` (replacing what is
    /// there) or wherever it fits, mapped writable to be filled. Returns its start and whether
    /// it reads as zero. Over a range wholly in use (the reservation a dynamic loader maps
    /// before it places each segment over it) the memory is taken as it is, not cleared and
    /// given back: the caller clears only what the file does not fill (clearing is emulated
    /// kernel work on PVM, 40 ms per MiB).
    pub fn map_for_file(&mut self, len: u64, fixed: Option<u64>) -> Result<(u64, bool), MemoryError> {
        if let Some(address) = fixed {
            let end = address.checked_add(page_up(len)).ok_or(MemoryError::NoMemory)?;
            let in_use = len != 0
                && address.is_multiple_of(PAGE_SIZE)
                && self.heap.contains(address, end)
                && self.heap_free.is_disjoint(address, end)
                && !(address < self.brk_mapped && end > self.brk_start);
            if in_use {
                self.map_heap(address, end, Some(READ_WRITE))?;
                return Ok((address, false));
            }
        }
        self.map_anonymous(len, Some(READ_WRITE), fixed).map(|start| (start, true))
    }

    /// The guest-physical address behind heap address `address` (of a mapping of this
    /// process's: a file mapping the host fills).
    pub fn heap_physical(&self, address: u64) -> u64 {
        self.heap.physical(address)
    }

    /// Copies `bytes` into heap memory at `start` (mapped by this job: a file mapping being
    /// filled).
    pub fn fill_heap(&mut self, start: u64, bytes: &[u8]) {
        phys::bytes_mut(self.heap.physical(start), bytes.len()).copy_from_slice(bytes);
    }

    /// Clears heap memory `[start, start + len)` (mapped by this job: the part of a file
    /// mapping past the file's bytes).
    pub fn clear_heap_range(&mut self, start: u64, len: u64) {
        phys::zero(self.heap.physical(start), len as usize);
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
            // What the break had mapped ahead of itself goes back whole when a hole is made
            // in it, so the break can grow across the hole as on Linux.
            let ahead = page_up(self.brk);
            if heap_start < self.brk_mapped && heap_end > ahead {
                self.release_heap(ahead, self.brk_mapped)?;
                self.brk_mapped = ahead;
            }
            self.release_heap(heap_start, heap_end)?;
        }
        self.note_stack_unmapped(start, end);
        self.aspace.unmap(start, end - start)?;
        Ok(())
    }

    fn note_stack_unmapped(&mut self, start: u64, end: u64) {
        if start < self.stack.end && end > self.stack.start {
            self.stack_clear_from = self.stack_clear_from.min(start.max(self.stack.start));
        }
    }

    /// `mprotect`: every page of the range must be in use.
    pub fn protect(&mut self, start: u64, len: u64, access: Access) -> Result<(), MemoryError> {
        if !start.is_multiple_of(PAGE_SIZE) {
            return Err(MemoryError::InvalidArgument);
        }
        let end = start.checked_add(page_up(len)).ok_or(MemoryError::NoMemory)?;
        let region =
            [self.image, self.stack, self.heap].into_iter().find(|region| region.contains(start, end)).ok_or(MemoryError::NoMemory)?;
        if start == end {
            return Ok(());
        }
        if region.start == self.heap.start && !self.heap_free.is_disjoint(start, end) {
            return Err(MemoryError::NoMemory);
        }
        match access {
            Some(protection) if region.start == self.image.start => {
                if protection.write {
                    self.unshare_image_pages(start, end);
                }
                // Runs of pages that are physically contiguous keep their backing.
                let mut address = start;
                while address < end {
                    let page = ((address - self.image.start) / PAGE_SIZE) as usize;
                    let physical = self.image_pages[page];
                    let mut run_end = address + PAGE_SIZE;
                    while run_end < end
                        && self.image_pages[((run_end - self.image.start) / PAGE_SIZE) as usize] == physical + (run_end - address)
                    {
                        run_end += PAGE_SIZE;
                    }
                    self.aspace.map(address, physical, run_end - address, protection)?;
                    address = run_end;
                }
            }
            Some(protection) => {
                self.note_stack_unmapped(start, end); // a new mapping starts clean
                self.aspace.map(start, region.physical(start), end - start, protection)?
            }
            None => {
                self.note_stack_unmapped(start, end);
                self.aspace.unmap(start, end - start)?
            }
        }
        Ok(())
    }

    /// Gives the image's pages in `[start, end)` that map the executable file's own pages
    /// (read-only segments) a copy in the image block, before they become writable: a write
    /// must not reach the file, which other processes map too.
    fn unshare_image_pages(&mut self, start: u64, end: u64) {
        for address in (start..end).step_by(PAGE_SIZE as usize) {
            let page = ((address - self.image.start) / PAGE_SIZE) as usize;
            let own = self.image.physical(address);
            if self.image_pages[page] != own {
                phys::bytes_mut(own, PAGE_SIZE as usize).copy_from_slice(phys::bytes(self.image_pages[page], PAGE_SIZE as usize));
                self.image_pages[page] = own;
            }
        }
    }

    /// Runs of the image's pages that are its block's own (copied or zero-filled by the
    /// kernel), as (address, length): the others are the executable file's pages.
    fn image_block_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (page, &physical) in self.image_pages.iter().enumerate() {
            let address = self.image.start + page as u64 * PAGE_SIZE;
            if physical != self.image.physical(address) {
                continue;
            }
            match runs.last_mut() {
                Some((start, len)) if *start + *len == address => *len += PAGE_SIZE,
                _ => runs.push((address, PAGE_SIZE)),
            }
        }
        runs
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

    /// An empty stand-in (no memory, a table root of its own), for `execve` to take a process's
    /// memory away before it has the new image.
    pub fn empty() -> Result<JobMemory, MemoryError> {
        let none = Region { start: 0, end: 0, physical_start: 0 };
        Ok(JobMemory::new(AddressSpace::new()?, none, Vec::new(), none, none))
    }

    /// The parts of the heap in use (in the `brk` area or mapped), in order.
    fn heap_in_use(&self, end: u64) -> Vec<Range> {
        self.heap_free.gaps(self.heap.start, end).collect()
    }

    /// A copy for a forked child, Kitten-style: new contiguous blocks at the same virtual
    /// addresses, filled in one pass each (the image block; the stack from `user_stack_pointer`
    /// up, what lies below it being dead; the heap's used ranges), and page tables that repeat
    /// the parent's mappings and rights, pointing into the new blocks (pages outside them: the
    /// executable's own read-only pages, the vDSO, stay shared). The child's heap ends
    /// `CHILD_HEAP_SLACK` above the parent's highest used byte, its stack starts
    /// `CHILD_STACK_SLACK` below the 2 MiB block holding the stack pointer: a child costs
    /// megabytes, not a copy of its parent's whole reservation.
    pub fn fork(&self, user_stack_pointer: u64) -> Result<JobMemory, MemoryError> {
        let highest_used = self.heap_in_use(self.heap.end).last().map_or(self.heap.start, |range| range.end);
        let heap_end = (highest_used.next_multiple_of(HUGE_PAGE_SIZE) + CHILD_HEAP_SLACK).min(self.heap.end);
        let on_main_stack = self.stack.contains(user_stack_pointer, user_stack_pointer);
        // A thread on a stack of its own forked: the main stack stays whole.
        let live_stack = if on_main_stack { (user_stack_pointer - 128) / PAGE_SIZE * PAGE_SIZE } else { self.stack.start };
        let stack_start = (live_stack / HUGE_PAGE_SIZE * HUGE_PAGE_SIZE).saturating_sub(CHILD_STACK_SLACK).max(self.stack.start);
        let mut blocks: Vec<Region> = Vec::new();
        let mut allocate = |start: u64, end: u64| -> Result<Region, MemoryError> {
            let physical_start = pmem::allocate(end - start, HUGE_PAGE_SIZE).ok_or(MemoryError::NoMemory)?;
            let block = Region { start, end, physical_start };
            blocks.push(block);
            Ok(block)
        };
        let copy = (|| {
            let image = allocate(self.image.start, self.image.end)?;
            let stack = allocate(stack_start, self.stack.end)?;
            let heap = allocate(self.heap.start, heap_end)?;
            Ok::<_, MemoryError>((image, stack, heap))
        })();
        let (image, stack, heap) = match copy {
            Ok(regions) => regions,
            Err(error) => {
                for block in blocks {
                    pmem::free_clean(block.physical_start, block.end - block.start);
                }
                return Err(error);
            }
        };
        let copy_range = |from: &Region, to: &Region, start: u64, end: u64| {
            phys::bytes_mut(to.physical(start), (end - start) as usize)
                .copy_from_slice(phys::bytes(from.physical(start), (end - start) as usize));
        };
        for (start, len) in self.image_block_runs() {
            copy_range(&self.image, &image, start, start + len);
        }
        copy_range(&self.stack, &stack, live_stack.max(stack.start), stack.end);
        let heap_used = self.heap_in_use(heap_end);
        for range in &heap_used {
            copy_range(&self.heap, &heap, range.start, range.end);
        }
        let mut heap_free = Box::new(RangeSet::new());
        for range in self.heap_free.ranges().iter().filter(|range| range.start < heap_end) {
            heap_free.insert(range.start, range.end.min(heap_end)).map_err(|_| MemoryError::NoMemory)?;
        }
        // The child's page for the parent's physical page `physical`: the same virtual page of
        // the child's block, none if the child's (shorter) block lacks it, the same page if it
        // is not the parent's own memory.
        let moved = |physical: u64| {
            let owner = [(&self.image, &image), (&self.stack, &stack), (&self.heap, &heap)]
                .into_iter()
                .find(|(from, _)| physical >= from.physical_start && physical - from.physical_start < from.end - from.start);
            match owner {
                Some((from, to)) => {
                    let address = from.start + (physical - from.physical_start);
                    to.contains(address, address + 1).then(|| to.physical(address))
                }
                None => Some(physical),
            }
        };
        let image_pages = self.image_pages.iter().map(|&page| moved(page).unwrap_or(page)).collect();
        let mut aspace = AddressSpace::new()?;
        // Runs of leaves contiguous on both sides with the same rights become one `map`.
        let mut run: Option<(u64, u64, u64, Protection)> = None;
        let mut failed = false;
        // Only the parent's own regions are walked (the image, the child's part of the stack,
        // the used heap); the vDSO and the system-call page are mapped as for a new image, and
        // XPMEM attachments are not inherited.
        let walked =
            [Range { start: image.start, end: image.end }, Range { start: stack.start, end: stack.end }].into_iter().chain(heap_used);
        for range in walked {
            self.aspace.for_each_leaf_in(range.start, range.end, |address, physical, size, protection, _| {
                let Some(physical) = moved(physical) else { return };
                match &mut run {
                    Some((start, run_physical, len, rights))
                        if *start + *len == address && *run_physical + *len == physical && *rights == protection =>
                    {
                        *len += size
                    }
                    _ => {
                        if let Some((start, run_physical, len, rights)) = run.replace((address, physical, size, protection)) {
                            failed |= aspace.map(start, run_physical, len, rights).is_err();
                        }
                    }
                }
            });
        }
        if let Some((start, run_physical, len, rights)) = run {
            failed |= aspace.map(start, run_physical, len, rights).is_err();
        }
        failed |= crate::vdso::map_into(&mut aspace).is_none();
        if crate::trap::ring3_syscall_page_in_use() {
            failed |= crate::job::map_ring3_syscall_page_into(&mut aspace).is_err();
        }
        failed |= crate::job::map_xstate_stub_page_into(&mut aspace).is_err();
        // A new image's memory over the copied regions, with the parent's heap layout.
        let child = JobMemory {
            heap_free,
            brk_start: self.brk_start,
            brk: self.brk,
            brk_mapped: self.brk_mapped,
            mmap_floor: self.mmap_floor.min(heap_end),
            stack_clear_from: live_stack.max(stack.start),
            ..JobMemory::new(aspace, image, image_pages, stack, heap)
        };
        if failed {
            child.release();
            return Err(MemoryError::NoMemory);
        }
        Ok(child)
    }

    /// Gives everything back to `pmem` (no CPU may use this address space any more), cleared
    /// only where it may hold data (clearing is emulated kernel work on PVM, about 40 ms per
    /// MiB): the image block's own pages, the stack from its lowest page user code wrote (its
    /// leaf's dirty bit) or the kernel wrote, the heap where it was used; then the page tables.
    pub fn release(self) {
        self.release_with(clear_here);
    }

    /// `release`, clearing with `zero` (the job's end in a persistent enclave has the host
    /// clear large ranges: `enclave::zero_memory`).
    pub fn release_with(mut self, zero: Zero) {
        let (heap_physical, heap_size) = self.clear_heap(zero);
        pmem::free_clean(heap_physical, heap_size);
        let stack = self.stack;
        let mut clear_from = self.stack_clear_from;
        self.aspace.for_each_leaf_in(stack.start, stack.end, |address, _, _, _, dirty| {
            if dirty {
                clear_from = clear_from.min(address);
            }
        });
        zero(stack.physical(clear_from.min(stack.end)), stack.end - clear_from.min(stack.end));
        pmem::free_clean(stack.physical_start, stack.end - stack.start);
        for (start, len) in self.image_block_runs() {
            zero(self.image.physical(start), len);
        }
        pmem::free_clean(self.image.physical_start, self.image.end - self.image.start);
        self.aspace.free();
    }
}
