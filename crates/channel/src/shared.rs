//! The only module with `unsafe` code: typed access to a region of memory that another address
//! space (a guest kernel, another host process) writes concurrently.
//!
//! Every access goes through an offset that is checked against the region's size, so a caller
//! that computes an offset from corrupted data gets a panic-free `None` (never an out-of-bounds
//! access). Counters and flags are accessed as atomics; payload bytes are copied with volatile
//! word accesses, because the peer may be changing them while we copy (we then copy garbage,
//! which the protocol tolerates, but the compiler must not assume the bytes are stable).

use core::sync::atomic::{AtomicU32, AtomicU64};

/// A region of shared memory: a base pointer and a size, both fixed at construction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedRegion {
    base: *mut u8,
    size: usize,
}

// SAFETY: the region is only ever accessed through atomics and volatile copies, which are
// well-defined under concurrent access from any number of threads (or processes).
unsafe impl Send for SharedRegion {}
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// # Safety
    /// `base` must be valid for reads and writes of `size` bytes, aligned to 4096 bytes, for as
    /// long as the returned value (or any copy of it) is used. Other parties may write the memory
    /// concurrently, but only with atomic or volatile accesses.
    pub(crate) unsafe fn new(base: *mut u8, size: usize) -> SharedRegion {
        SharedRegion { base, size }
    }

    /// Whether `len` bytes at `offset` lie inside the region, with `offset` aligned to `align`.
    fn in_bounds(&self, offset: usize, len: usize, align: usize) -> bool {
        offset % align == 0 && offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    pub(crate) fn u64_at(&self, offset: usize) -> Option<&AtomicU64> {
        if !self.in_bounds(offset, 8, 8) {
            return None;
        }
        // SAFETY: in bounds and aligned (the base is page aligned); AtomicU64 has the layout of
        // u64 and tolerates concurrent access by construction.
        Some(unsafe { &*(self.base.add(offset) as *const AtomicU64) })
    }

    pub(crate) fn u32_at(&self, offset: usize) -> Option<&AtomicU32> {
        if !self.in_bounds(offset, 4, 4) {
            return None;
        }
        // SAFETY: as for `u64_at`.
        Some(unsafe { &*(self.base.add(offset) as *const AtomicU32) })
    }

    /// Copies `dest.len()` bytes from the region at `offset` (8-byte aligned) into `dest`.
    pub(crate) fn read_bytes(&self, offset: usize, dest: &mut [u8]) -> Option<()> {
        if !self.in_bounds(offset, dest.len(), 8) {
            return None;
        }
        // SAFETY: the source range is in bounds and 8-byte aligned; volatile reads of plain
        // integers are fine whatever the peer writes concurrently.
        unsafe {
            let source = self.base.add(offset);
            let mut chunks = dest.chunks_exact_mut(8);
            let mut word = source as *const u64;
            for chunk in &mut chunks {
                chunk.copy_from_slice(&word.read_volatile().to_ne_bytes());
                word = word.add(1);
            }
            let mut byte = word as *const u8;
            for slot in chunks.into_remainder() {
                *slot = byte.read_volatile();
                byte = byte.add(1);
            }
        }
        Some(())
    }

    /// Copies `source` into the region at `offset` (8-byte aligned).
    pub(crate) fn write_bytes(&self, offset: usize, source: &[u8]) -> Option<()> {
        if !self.in_bounds(offset, source.len(), 8) {
            return None;
        }
        // SAFETY: the destination range is in bounds and 8-byte aligned.
        unsafe {
            let dest = self.base.add(offset);
            let mut chunks = source.chunks_exact(8);
            let mut word = dest as *mut u64;
            for chunk in &mut chunks {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(chunk);
                word.write_volatile(u64::from_ne_bytes(bytes));
                word = word.add(1);
            }
            let mut byte = word as *mut u8;
            for value in chunks.remainder() {
                byte.write_volatile(*value);
                byte = byte.add(1);
            }
        }
        Some(())
    }

    /// Zeroes `len` bytes at `offset` (8-byte aligned, `len` a multiple of 8).
    pub(crate) fn zero(&self, offset: usize, len: usize) -> Option<()> {
        if !self.in_bounds(offset, len, 8) || len % 8 != 0 {
            return None;
        }
        // SAFETY: in bounds and aligned.
        unsafe {
            let mut word = self.base.add(offset) as *mut u64;
            for _ in 0..len / 8 {
                word.write_volatile(0);
                word = word.add(1);
            }
        }
        Some(())
    }
}
