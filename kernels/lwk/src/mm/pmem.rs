//! Physical memory manager: the free RAM of the memory map as contiguous ranges (Kitten's
//! pmem). Allocation is first-fit and physically contiguous.
//!
//! Invariant: free memory is zero. RAM is zero when the VM starts (clowder-vmm backs it with a
//! fresh memfd, QEMU with anonymous memory), and `free` zeroes what it takes back, so
//! allocations, which may be gigabytes for a job, never need to be cleared.

use super::ranges::{Range, RangeSet};
use crate::arch::paging::PAGE_SIZE;
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::console::log;

/// The free list's ranges at most (holes between allocations).
const FREE_RANGES: usize = 256;

static FREE: SpinLock<RangeSet<FREE_RANGES>> = SpinLock::new(RangeSet::new());

pub fn add_free(start: u64, end: u64) {
    FREE.lock().insert(start, end).expect("memory map too fragmented");
}

pub fn reserve(start: u64, end: u64) {
    FREE.lock().remove(start, end).expect("memory map too fragmented");
}

/// `size` bytes (a page multiple) aligned to `align`, zeroed, from the lowest memory that fits.
pub fn allocate(size: u64, align: u64) -> Option<u64> {
    FREE.lock().take_lowest(size, align)
}

pub fn allocate_pages(pages: u64) -> Option<u64> {
    allocate(pages * PAGE_SIZE, PAGE_SIZE)
}

pub fn free(start: u64, size: u64) {
    phys::zero(start, size as usize);
    free_clean(start, size);
}

/// Gives back memory the caller knows to be zero already (never written, or cleared), so that
/// a job's untouched gigabytes of heap are not cleared again (kernel work, emulated on PVM).
pub fn free_clean(start: u64, size: u64) {
    // Freed ranges were allocated from the set, so re-inserting them cannot overlap; running
    // out of slots needs more than FREE_RANGES holes and loses the memory, which is said.
    if FREE.lock().insert(start, start + size).is_err() {
        log!("pmem: the free list is full ({FREE_RANGES} ranges): {size:#x} bytes at {start:#x} are lost until the enclave restarts");
    }
}

pub fn free_pages(start: u64, pages: u64) {
    free(start, pages * PAGE_SIZE);
}

/// All the RAM the kernel was given to manage (free at boot, after the kernel and modules).
static MANAGED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

pub fn total_managed() -> u64 {
    MANAGED.load(core::sync::atomic::Ordering::Relaxed)
}

/// Records the current free memory as the total managed (called once the memory map is in).
pub fn note_managed() {
    MANAGED.store(total_free(), core::sync::atomic::Ordering::Relaxed);
}

pub fn total_free() -> u64 {
    FREE.lock().total()
}

/// The largest block `allocate(_, align)` can return (`align` a power of two).
pub fn largest_free_block(align: u64) -> u64 {
    FREE.lock()
        .ranges()
        .iter()
        .map(|range| (range.end & !(align - 1)).saturating_sub(range.start.next_multiple_of(align)))
        .max()
        .unwrap_or(0)
}

/// Runs `f` on each free range (for the boot report).
pub fn for_each_free(mut f: impl FnMut(Range)) {
    FREE.lock().ranges().iter().copied().for_each(&mut f);
}
