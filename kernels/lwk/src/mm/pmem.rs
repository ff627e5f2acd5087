//! Physical memory manager: the free RAM of the memory map (Kitten's pmem), physically
//! contiguous. Large blocks (a job's gigabytes) are first-fit from the lowest range; blocks of
//! up to 16 pages (page tables, kernel stacks, the heap's pages) come from 2 MiB chunks with
//! bitmaps, in a bounded number of steps (`lwk_core::physmem`).
//!
//! Invariant: free memory is zero. RAM is zero when the VM starts (clowder-vmm backs it with a
//! fresh memfd, QEMU with anonymous memory), and `free` zeroes what it takes back, so
//! allocations, which may be gigabytes for a job, never need to be cleared.

use super::ranges::Range;
use crate::arch::paging::PAGE_SIZE;
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::console::log;
use lwk_core::physmem::{FreeError, FreeMemory};

/// 256 ranges; 256 chunks (512 MiB of small blocks before they fall back to the ranges).
static FREE: SpinLock<FreeMemory<256, 256>> = SpinLock::new(FreeMemory::new());

pub fn add_free(start: u64, end: u64) {
    FREE.lock().add(start, end).expect("memory map too fragmented");
}

pub fn reserve(start: u64, end: u64) {
    FREE.lock().reserve(start, end).expect("memory map too fragmented");
}

/// `size` bytes (a page multiple) aligned to `align`, zeroed.
pub fn allocate(size: u64, align: u64) -> Option<u64> {
    FREE.lock().allocate(size, align)
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
    // Logged after the lock is dropped (the console may take other locks).
    let result = FREE.lock().free(start, size);
    match result {
        Ok(()) => {}
        Err(FreeError::Lost(bytes)) => {
            log!("pmem: {bytes:#x} bytes at {start:#x} lost: more than 256 free ranges ({:#x} lost in all)", lost())
        }
        Err(FreeError::NotAllocated) => log!("pmem: free of {size:#x} bytes at {start:#x} refused: not allocated"),
    }
}

pub fn free_pages(start: u64, pages: u64) {
    free(start, pages * PAGE_SIZE);
}

/// Bytes given back that no free range could hold.
pub fn lost() -> u64 {
    FREE.lock().lost()
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
    FREE.lock().largest_block(align)
}

/// Runs `f` on each free range (for the boot report, and clearing at boot).
pub fn for_each_free(f: impl FnMut(Range)) {
    FREE.lock().for_each_free(f);
}
