//! The only module with `unsafe` code: typed access to a region of memory that another address
//! space (a guest kernel, another host process) writes concurrently.
//!
//! Every access goes through an offset that is checked against the region's size, so a caller
//! that computes an offset from corrupted data gets a panic-free `None` (never an out-of-bounds
//! access). Counters and flags are accessed as atomics; payload bytes are copied by inline
//! assembly (string instructions), because the peer may be changing them while we copy (we then
//! copy garbage, which the protocol tolerates, but the compiler must not assume the bytes are
//! stable).

use core::sync::atomic::{AtomicU32, AtomicU64};

/// A region of shared memory: a base pointer and a size, both fixed at construction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedRegion {
    base: *mut u8,
    size: usize,
}

// SAFETY: the region is only ever accessed through atomics, volatile stores and assembly
// copies, which are well-defined under concurrent access from any number of threads (or
// processes).
unsafe impl Send for SharedRegion {}
// SAFETY: as for Send: shared references only reach the memory through those same accesses.
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
        // SAFETY: the source range is in bounds; `dest` is ours.
        unsafe { copy_bytes(self.base.add(offset), dest.as_mut_ptr(), dest.len()) };
        Some(())
    }

    /// Copies `source` into the region at `offset` (8-byte aligned).
    pub(crate) fn write_bytes(&self, offset: usize, source: &[u8]) -> Option<()> {
        if !self.in_bounds(offset, source.len(), 8) {
            return None;
        }
        // SAFETY: the destination range is in bounds; `source` is ours.
        unsafe { copy_bytes(source.as_ptr(), self.base.add(offset), source.len()) };
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

/// Copies `len` bytes from `source` to `dest` with string instructions (8 bytes at a time, then
/// the rest). Inline assembly is opaque to the compiler, as volatile accesses are: the peer may
/// be writing the bytes while we copy. A guest kernel whose instructions are emulated (PVM) pays
/// about one instruction's time per 8 bytes, where a loop of volatile words took five.
///
/// # Safety
/// `source` must be valid for reads and `dest` for writes of `len` bytes.
unsafe fn copy_bytes(source: *const u8, dest: *mut u8, len: usize) {
    // SAFETY: the caller's ranges; the direction flag is clear (the ABI's state).
    unsafe {
        core::arch::asm!(
            "rep movsq",
            "mov rcx, {tail}",
            "rep movsb",
            tail = in(reg) len % 8,
            inout("rcx") len / 8 => _,
            inout("rsi") source => _,
            inout("rdi") dest => _,
            options(nostack, preserves_flags),
        );
    }
}
