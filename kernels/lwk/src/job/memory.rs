//! A job's memory, Kitten-style: three physically contiguous regions reserved at load (image,
//! stack, heap); page tables are filled when memory is handed out and cleared when it is given
//! back, never on demand.
//!
//! The heap block shows through two windows, as Linux's default layout places the break and
//! the mappings: `brk` grows up from its bottom, seen right above the image (the `heap`
//! region's addresses, which the bookkeeping uses for the whole block: "heap addresses"), and
//! `mmap` carves from its top, top-down, seen in a window that ends `MMAP_GAP` below the top
//! of the stack (`mmap_window`). Each part of the block is the break's or a mapping's, never
//! both, so each window maps only its own parts: the break's are those below `brk_mapped`.
//! Both windows keep one virtual-to-physical offset each, so 2 MiB pages still fit.
//!
//! What a process uses thus sits at the two ends of its heap: `fork` gives the child a heap
//! without the free middle (its mapping window moves up by as much, the mappings keeping
//! their addresses), not a copy of the whole reservation.
//!
//! Heap memory given back is not cleared at once but marked dirty, and `mmap` prefers clean
//! memory: clearing is kernel work (about 40 ms per MiB when kernel code is emulated, as on
//! PVM), and with a heap of most of the machine a job rarely needs to reuse anything. When
//! it must (a job that maps and unmaps 512 MiB every interval), the dirty runs it takes are not
//! cleared here but listed (`take_uncleared`): the system call clears them once it has let go
//! of the process table, large runs by the host at native speed (`enclave::zero_memory`;
//! 512 MiB took 45-56 s of emulated `memset` per `mmap` on PVM).

use crate::arch::paging::{OutOfMemory, Protection, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::phys;
use crate::mm::aspace::AddressSpace;
use crate::mm::pmem;
use crate::mm::ranges::{Range, RangeSet};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

/// `env` with glibc's malloc held to one arena unless the job names its own limit. glibc gives
/// threads that allocate arenas of their own, each reserving 64 MiB (128 MiB while it aligns
/// it) and counting on Linux to back only what is touched; here every mapping takes its memory
/// at once from the job's heap. An MPI rank's three threads thus took its whole 192 MiB heap
/// when ranks shared an enclave: every later mmap failed, glibc fell back to a mapping per
/// allocation, and `mpirun -n 2` in one enclave gave no result. musl ignores the variable.
pub fn with_allocator_defaults(env: &[String]) -> Vec<String> {
    const ARENAS: &str = "MALLOC_ARENA_MAX=";
    let mut env = env.to_vec();
    if !env.iter().any(|entry| entry.starts_with(ARENAS)) {
        env.push(alloc::format!("{ARENAS}1"));
    }
    env
}

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

/// Which window of the heap block a part of it shows in (see the module's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Window {
    Brk,
    Mmap,
}

/// The bottom of the heap kept for `brk` (a quarter of small heaps): anonymous mappings go
/// above it while there is room. glibc's malloc moves on to `mmap` when `brk` stops growing.
const BRK_AREA: u64 = 8 << 20;
/// How far below the top of the stack the mapping window ends, at least: Linux's least gap
/// below the stack for `mmap_base` (its default layout, without randomisation).
const MMAP_GAP: u64 = 128 << 20;
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
    /// Anonymous mappings are placed at or above this heap address when they fit.
    mmap_floor: u64,
    /// Where the mapping window ends (2 MiB aligned, the same for a process and its forks).
    mmap_end: u64,
    /// The lowest stack address the kernel wrote through its own window (a forked child's
    /// copy) or whose mapping went away (so its dirty bit is lost): `release` clears the stack
    /// from here or from its lowest written page, whichever is lower.
    stack_clear_from: u64,
    /// Physical runs handed out (claimed, or discarded) that still hold old data, as (start,
    /// len): the caller clears them before returning to user code (`take_uncleared`).
    uncleared: Vec<(u64, u64)>,
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
        let mmap_end = stack.start.min(super::STACK_TOP - MMAP_GAP) / HUGE_PAGE_SIZE * HUGE_PAGE_SIZE;
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
            mmap_end,
            stack_clear_from: stack.end,
            uncleared: Vec::new(),
        }
    }

    /// The window the mappings show through: the heap block's addresses moved up to end at
    /// `mmap_end` (its `physical` is right for addresses in it).
    pub fn mmap_window(&self) -> Region {
        let size = self.heap.end - self.heap.start;
        Region { start: self.mmap_end.saturating_sub(size), end: self.mmap_end, physical_start: self.heap.physical_start }
    }

    /// Where heap address `address` shows in `window`.
    fn virtual_of(&self, window: Window, address: u64) -> u64 {
        match window {
            Window::Brk => address,
            Window::Mmap => address - self.heap.start + self.mmap_window().start,
        }
    }

    /// The heap addresses behind `[start, end)` of the mapping window, if it lies wholly in
    /// the mappings' part of it (above what the break holds).
    fn mapping_range(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let window = self.mmap_window();
        let to_heap = |address: u64| address - window.start + self.heap.start;
        (start < end && window.contains(start, end) && to_heap(start) >= self.brk_mapped).then(|| (to_heap(start), to_heap(end)))
    }

    /// The break's part of the heap, where it shows (right above the image).
    fn brk_region(&self) -> Region {
        Region { start: self.heap.start, end: self.brk_mapped, physical_start: self.heap.physical_start }
    }

    /// The mappings' part of the heap, where it shows (the top of the mapping window).
    fn mappings_region(&self) -> Region {
        let start = self.virtual_of(Window::Mmap, self.brk_mapped);
        Region { start, end: self.mmap_end, physical_start: self.heap.physical(self.brk_mapped) }
    }

    fn map_heap(&mut self, window: Window, start: u64, end: u64, access: Access) -> Result<(), MemoryError> {
        let address = self.virtual_of(window, start);
        match access {
            Some(protection) => self.aspace.map(address, self.heap.physical(start), end - start, protection)?,
            None => self.aspace.unmap(address, end - start)?,
        }
        Ok(())
    }

    /// Unmaps heap pages (seen in `window`) and gives them back; the ones that were in use
    /// become dirty.
    fn release_heap(&mut self, window: Window, start: u64, end: u64) -> Result<(), MemoryError> {
        self.aspace.unmap(self.virtual_of(window, start), end - start)?;
        let used: Vec<Range> = self.heap_free.gaps(start, end).collect();
        for range in used {
            self.heap_dirty.insert(range.start, range.end).map_err(|_| MemoryError::NoMemory)?;
        }
        self.heap_free.insert(start, end).map_err(|_| MemoryError::NoMemory)
    }

    /// Takes `[start, end)` (free) out of the heap's free memory; its dirty parts are listed
    /// to be cleared (`uncleared`).
    fn claim(&mut self, start: u64, end: u64) -> Result<(), MemoryError> {
        self.heap_free.remove(start, end).map_err(|_| MemoryError::NoMemory)?;
        let dirty: Vec<Range> = self.heap_dirty.ranges().iter().copied().filter(|r| r.start < end && r.end > start).collect();
        for range in dirty {
            let (from, to) = (range.start.max(start), range.end.min(end));
            self.uncleared.push((self.heap.physical(from), to - from));
        }
        self.heap_dirty.remove(start, end).map_err(|_| MemoryError::NoMemory)
    }

    /// The physical runs that the last changes handed out with old data in them: the caller
    /// clears them before user code runs (outside the process table's lock, so that large runs
    /// can wait for the host: `enclave::zero_memory`). Until then the process's own old data
    /// shows there, no other process's: dirty heap memory only ever held this process's.
    pub fn take_uncleared(&mut self) -> Vec<(u64, u64)> {
        core::mem::take(&mut self.uncleared)
    }

    /// Clears `uncleared` in this kernel now (before the kernel writes into fresh memory).
    fn clear_uncleared_here(&mut self) {
        for (physical, len) in self.take_uncleared() {
            phys::zero(physical, len as usize);
        }
    }

    /// The highest `len` free heap bytes aligned to `align` above the `brk` area (below it if
    /// nothing fits above), clean ones if possible: mappings go top-down, as on Linux.
    fn find_free(&self, len: u64, align: u64) -> Option<u64> {
        let fit_above = |floor: u64| {
            move |range: &Range| {
                let start = (range.end.checked_sub(len)? / align) * align;
                (start >= range.start.max(floor)).then_some(start)
            }
        };
        let clean_parts: Vec<Range> =
            self.heap_free.ranges().iter().flat_map(|free| self.heap_dirty.gaps(free.start, free.end).collect::<Vec<_>>()).collect();
        clean_parts
            .iter()
            .rev()
            .find_map(fit_above(self.mmap_floor))
            .or_else(|| self.heap_free.ranges().iter().rev().find_map(fit_above(self.mmap_floor)))
            .or_else(|| self.heap_free.ranges().iter().rev().find_map(fit_above(self.brk_mapped)))
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
                && self.map_heap(Window::Brk, mapped, end, Some(READ_WRITE)).is_ok();
            if grown {
                self.brk_mapped = end;
            }
            grown
        } else if requested < self.brk && new_end < mapped {
            let released = self.release_heap(Window::Brk, new_end, mapped).is_ok();
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

    /// Anonymous `mmap`: at `fixed` (replacing what is there; in the mapping window, above
    /// what the break holds) or wherever it fits, 2 MiB aligned when it is that large so it
    /// gets 2 MiB pages. Returns where it shows.
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
                let (start, end) = self.mapping_range(address, end).ok_or(MemoryError::NoMemory)?;
                self.release_heap(Window::Mmap, start, end)?;
                self.claim(start, end)?;
                start
            }
            None => {
                let align = if len >= HUGE_PAGE_SIZE { HUGE_PAGE_SIZE } else { PAGE_SIZE };
                let start = self.find_free(len, align).ok_or(MemoryError::NoMemory)?;
                self.claim(start, start + len)?;
                start
            }
        };
        self.map_heap(Window::Mmap, start, start + len, access)?;
        Ok(self.virtual_of(Window::Mmap, start))
    }

    /// Whether any page of `[start, start + len)` is in use (MAP_FIXED_NOREPLACE's test):
    /// the image, the stack, the break's part or a mapping.
    pub fn overlaps_use(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(page_up(len));
        let overlaps = |region: &Region| region.start < end && start < region.end;
        let mappings = self.mappings_region();
        [self.image, self.stack, self.brk_region()].iter().any(overlaps)
            || (overlaps(&mappings) && {
                let to_heap = |address: u64| address.clamp(mappings.start, mappings.end) - mappings.start + self.brk_mapped;
                !self.heap_free.contains(to_heap(start), to_heap(end))
            })
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
            let in_use = address
                .is_multiple_of(PAGE_SIZE)
                .then(|| self.mapping_range(address, end))
                .flatten()
                .filter(|&(start, end)| self.heap_free.is_disjoint(start, end));
            if let Some((start, end)) = in_use {
                self.map_heap(Window::Mmap, start, end, Some(READ_WRITE))?;
                return Ok((address, false));
            }
        }
        self.map_anonymous(len, Some(READ_WRITE), fixed).map(|start| (start, true))
    }

    /// The guest-physical address behind `address` of a mapping of this process's (a file
    /// mapping the host fills).
    pub fn heap_physical(&self, address: u64) -> u64 {
        self.mmap_window().physical(address)
    }

    /// Copies `bytes` into this process's mapping at `start` (a file mapping being filled).
    pub fn fill_heap(&mut self, start: u64, bytes: &[u8]) {
        phys::bytes_mut(self.heap_physical(start), bytes.len()).copy_from_slice(bytes);
    }

    /// Clears `[start, start + len)` of this process's mapping (the part of a file mapping past
    /// the file's bytes).
    pub fn clear_heap_range(&mut self, start: u64, len: u64) {
        phys::zero(self.heap_physical(start), len as usize);
    }

    /// `munmap`: heap memory goes back to the heap; in the image and stack only the pages
    /// disappear (their memory stays reserved to the job).
    pub fn unmap(&mut self, start: u64, len: u64) -> Result<(), MemoryError> {
        if !start.is_multiple_of(PAGE_SIZE) || len == 0 {
            return Err(MemoryError::InvalidArgument);
        }
        let end = start.checked_add(page_up(len)).ok_or(MemoryError::InvalidArgument)?;
        // The mappings' part first: the break's bound (`brk_mapped`) may move below.
        let mappings = self.mappings_region();
        let (from, to) = (start.clamp(mappings.start, mappings.end), end.clamp(mappings.start, mappings.end));
        if let Some((heap_start, heap_end)) = self.mapping_range(from, to) {
            self.release_heap(Window::Mmap, heap_start, heap_end)?;
        }
        let (heap_start, heap_end) = (start.clamp(self.heap.start, self.brk_mapped), end.clamp(self.heap.start, self.brk_mapped));
        if heap_start < heap_end {
            // What the break had mapped ahead of itself goes back whole when a hole is made
            // in it, so the break can grow across the hole as on Linux.
            let ahead = page_up(self.brk);
            if heap_end > ahead {
                self.release_heap(Window::Brk, ahead, self.brk_mapped)?;
                self.brk_mapped = ahead;
            }
            if heap_start < heap_end.min(self.brk_mapped) {
                self.release_heap(Window::Brk, heap_start, heap_end.min(self.brk_mapped))?;
            }
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
        let heap_parts = [self.brk_region(), self.mappings_region()];
        let region = [self.image, self.stack, heap_parts[0], heap_parts[1]]
            .into_iter()
            .find(|region| region.contains(start, end))
            .ok_or(MemoryError::NoMemory)?;
        if start == end {
            return Ok(());
        }
        let to_heap = |address: u64| address - region.start + (region.physical_start - self.heap.physical_start) + self.heap.start;
        if heap_parts.iter().any(|part| part.start == region.start) && !self.heap_free.is_disjoint(to_heap(start), to_heap(end)) {
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

    /// MADV_DONTNEED: heap and stack pages in the range stay mapped but read back as zero
    /// (once the caller has cleared `uncleared`).
    pub fn discard(&mut self, start: u64, len: u64) {
        let end = start.saturating_add(page_up(len));
        let (stack_from, stack_to) = (start.clamp(self.stack.start, self.stack.end), end.clamp(self.stack.start, self.stack.end));
        if stack_from < stack_to {
            self.uncleared.push((self.stack.physical(stack_from), stack_to - stack_from));
        }
        for part in [self.brk_region(), self.mappings_region()] {
            let (from, to) = (start.clamp(part.start, part.end), end.clamp(part.start, part.end));
            // The part's heap addresses: its physical offset in the block.
            let to_heap = |address: u64| address - part.start + (part.physical_start - self.heap.physical_start) + self.heap.start;
            let in_use: Vec<Range> = self.heap_free.gaps(to_heap(from), to_heap(to)).collect();
            for range in in_use {
                self.uncleared.push((self.heap.physical(range.start), range.len()));
            }
        }
    }

    /// `mremap` of a mapping: shrinks in place, grows in place when the pages above are free,
    /// otherwise moves (copying) if allowed.
    pub fn remap(&mut self, address: u64, old_len: u64, new_len: u64, may_move: bool) -> Result<u64, MemoryError> {
        let (old_len, new_len) = (page_up(old_len), page_up(new_len));
        if !address.is_multiple_of(PAGE_SIZE) || new_len == 0 {
            return Err(MemoryError::InvalidArgument);
        }
        let old_end = address.checked_add(old_len).ok_or(MemoryError::NoMemory)?;
        let (start, old_end) = self.mapping_range(address, old_end).ok_or(MemoryError::NoMemory)?;
        if !self.heap_free.is_disjoint(start, old_end) {
            return Err(MemoryError::NoMemory);
        }
        if new_len <= old_len {
            if new_len < old_len {
                self.release_heap(Window::Mmap, start + new_len, old_end)?;
            }
            return Ok(address);
        }
        let new_end = start + new_len;
        if self.heap.contains(start, new_end) && self.heap_free.contains(old_end, new_end) {
            self.claim(old_end, new_end)?;
            self.map_heap(Window::Mmap, old_end, new_end, Some(READ_WRITE))?;
            return Ok(address);
        }
        if !may_move {
            return Err(MemoryError::NoMemory);
        }
        let moved = self.map_anonymous(new_len, Some(READ_WRITE), None)?;
        // Cleared before the copy lands there, not after.
        self.clear_uncleared_here();
        phys::bytes_mut(self.heap_physical(moved), old_len as usize)
            .copy_from_slice(phys::bytes(self.heap.physical(start), old_len as usize));
        self.release_heap(Window::Mmap, start, old_end)?;
        Ok(moved)
    }

    /// An empty stand-in (no memory, a table root of its own), for `execve` to take a process's
    /// memory away before it has the new image.
    pub fn empty() -> Result<JobMemory, MemoryError> {
        let none = Region { start: 0, end: 0, physical_start: 0 };
        Ok(JobMemory::new(AddressSpace::new()?, none, Vec::new(), none, none))
    }

    /// The parts of the heap in use (the break's or mapped), in order, each with the window it
    /// shows in (a part crossing `brk_mapped` split there).
    fn heap_in_use(&self) -> Vec<(Window, Range)> {
        let mut parts = Vec::new();
        for range in self.heap_free.gaps(self.heap.start, self.heap.end) {
            if range.start < self.brk_mapped {
                parts.push((Window::Brk, Range { start: range.start, end: range.end.min(self.brk_mapped) }));
            }
            if range.end > self.brk_mapped {
                parts.push((Window::Mmap, Range { start: range.start.max(self.brk_mapped), end: range.end }));
            }
        }
        parts
    }

    /// A copy for a forked child, Kitten-style: new contiguous blocks at the same virtual
    /// addresses, filled in one pass each (the image block; the stack from `user_stack_pointer`
    /// up, what lies below it being dead; the heap's used ranges), and page tables that repeat
    /// the parent's mappings and rights, pointing into the new blocks (pages outside them: the
    /// executable's own read-only pages, the vDSO, stay shared). The child's heap lacks the
    /// free middle of the parent's: it keeps the break's part and the mappings', each with
    /// `CHILD_HEAP_SLACK` beside it (its mapping window ends where the parent's does, so it
    /// starts higher by as much and the mappings keep their addresses); its stack starts
    /// `CHILD_STACK_SLACK` below the 2 MiB block holding the stack pointer: a child costs
    /// megabytes, not a copy of its parent's whole reservation.
    pub fn fork(&self, user_stack_pointer: u64) -> Result<JobMemory, MemoryError> {
        let heap_used = self.heap_in_use();
        let low_end = (self.brk_mapped.next_multiple_of(HUGE_PAGE_SIZE) + CHILD_HEAP_SLACK).min(self.heap.end);
        let lowest_mapping = heap_used.iter().find(|(window, _)| *window == Window::Mmap).map_or(self.heap.end, |(_, range)| range.start);
        let high_start = (lowest_mapping / HUGE_PAGE_SIZE * HUGE_PAGE_SIZE).saturating_sub(CHILD_HEAP_SLACK).max(low_end);
        let gap = high_start - low_end;
        // A heap address of the parent's, kept (below `low_end` or from `high_start`), as the
        // child's.
        let to_child = |address: u64| if address < low_end { address } else { address - gap };
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
            let heap = allocate(self.heap.start, self.heap.end - gap)?;
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
        for (_, range) in &heap_used {
            phys::bytes_mut(heap.physical(to_child(range.start)), range.len() as usize)
                .copy_from_slice(phys::bytes(self.heap.physical(range.start), range.len() as usize));
        }
        let mut heap_free = Box::new(RangeSet::new());
        for range in self.heap_free.ranges() {
            for (start, end) in [(range.start, range.end.min(low_end)), (range.start.max(high_start), range.end)] {
                if start < end {
                    heap_free.insert(to_child(start), to_child(end - 1) + 1).map_err(|_| MemoryError::NoMemory)?;
                }
            }
        }
        // The child's page for the parent's physical page `physical`: the same virtual page of
        // the child's block (the same heap address, less `gap` above the middle), none if the
        // child's (smaller) block lacks it, the same page if it is not the parent's own memory.
        let moved = |physical: u64| {
            let owner = [(&self.image, &image), (&self.stack, &stack), (&self.heap, &heap)]
                .into_iter()
                .find(|(from, _)| physical >= from.physical_start && physical - from.physical_start < from.end - from.start);
            match owner {
                Some((from, to)) if core::ptr::eq(from, &self.heap) => {
                    let address = from.start + (physical - from.physical_start);
                    (address < low_end || address >= high_start).then(|| to.physical(to_child(address)))
                }
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
        let heap_shown = heap_used
            .iter()
            .map(|&(window, range)| Range { start: self.virtual_of(window, range.start), end: self.virtual_of(window, range.end) });
        let walked =
            [Range { start: image.start, end: image.end }, Range { start: stack.start, end: stack.end }].into_iter().chain(heap_shown);
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
            mmap_floor: self.mmap_floor.min(low_end),
            mmap_end: self.mmap_end,
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
