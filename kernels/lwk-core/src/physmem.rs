//! The kernel's free physical memory: contiguous ranges (`RangeSet`, first-fit from the lowest
//! address) for large blocks such as a job's gigabytes, with a `PagePool` of 2 MiB chunks in
//! front for blocks of up to 16 pages, the ones taken and given back on every fork, thread and
//! page table. Fixed-size, so it works before the heap exists; it never touches the memory it
//! manages (whether free memory is zero is the caller's affair).

use crate::pages::{Freed, PagePool, CHUNK_SIZE, MAX_BLOCK_PAGES, PAGE_SIZE};
use crate::ranges::{Range, RangeSet, TooFragmented};

/// Wholly free chunks the pool keeps besides those in use, so that a job going back and forth
/// across a chunk's end does not take and give back a chunk each time.
const SPARE_CHUNKS: usize = 1;

#[derive(Debug, PartialEq, Eq)]
pub enum FreeError {
    /// The block (or part of it) is in the pool and not allocated: a double free, or a block
    /// the pool never handed out. Nothing changed.
    NotAllocated,
    /// The ranges had no room for the block (more than `R` holes): these bytes are lost, and
    /// counted in `lost()`.
    Lost(u64),
}

/// `R` ranges and `C` chunks (a power of two).
pub struct FreeMemory<const R: usize, const C: usize> {
    ranges: RangeSet<R>,
    pool: PagePool<C>,
    lost: u64,
}

impl<const R: usize, const C: usize> Default for FreeMemory<R, C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const R: usize, const C: usize> FreeMemory<R, C> {
    pub const fn new() -> Self {
        FreeMemory { ranges: RangeSet::new(), pool: PagePool::new(), lost: 0 }
    }

    /// Adds free memory (the memory map, at boot).
    pub fn add(&mut self, start: u64, end: u64) -> Result<(), TooFragmented> {
        self.ranges.insert(start, end)
    }

    /// Takes memory in use out of the free ranges (the kernel image, modules, at boot, before
    /// anything is allocated: memory lent to the pool is not looked at).
    pub fn reserve(&mut self, start: u64, end: u64) -> Result<(), TooFragmented> {
        self.ranges.remove(start, end)
    }

    /// `size` bytes aligned to `align` (a power of two). Blocks the pool keeps come from its
    /// chunks (a new chunk taken from the lowest ranges when none has room); the rest, and
    /// small blocks once no 2 MiB chunk is left, from the lowest range that fits.
    pub fn allocate(&mut self, size: u64, align: u64) -> Option<u64> {
        if !align.is_power_of_two() || size == 0 {
            return None;
        }
        if PagePool::<C>::takes(size, align) {
            let (pages, align_pages) = (size / PAGE_SIZE, (align / PAGE_SIZE).max(1));
            if let Some(start) = self.pool.allocate(pages, align_pages) {
                return Some(start);
            }
            if let Some(base) = self.ranges.take_lowest(CHUNK_SIZE, CHUNK_SIZE) {
                if self.pool.add_chunk(base) {
                    return self.pool.allocate(pages, align_pages);
                }
                // Its slots are taken: the chunk goes back where it was (it was just removed,
                // so there is room for it).
                let _ = self.ranges.insert(base, base + CHUNK_SIZE);
            }
        }
        self.ranges.take_lowest(size, align).or_else(|| {
            // Empty chunks may be what splits the range that would fit (a chunk that finds no
            // room in the ranges is counted in `lost`).
            let _ = self.release_empty_chunks();
            self.ranges.take_lowest(size, align)
        })
    }

    /// Gives back `size` bytes at `start`, allocated before.
    pub fn free(&mut self, start: u64, size: u64) -> Result<(), FreeError> {
        if size == 0 {
            return Ok(());
        }
        let end = start.checked_add(size).ok_or(FreeError::NotAllocated)?;
        match self.pool.free(start, size) {
            Freed::Kept => return Ok(()),
            Freed::Emptied(base) if self.pool.empty_chunks() > SPARE_CHUNKS => return self.return_chunk(base),
            Freed::Emptied(_) => return Ok(()),
            Freed::NotAllocated => return Err(FreeError::NotAllocated),
            Freed::NotInPool => {}
        }
        // A block of the ranges ending in a chunk (only a bad block can).
        if (end - 1) / CHUNK_SIZE != start / CHUNK_SIZE && self.pool.contains(end - 1) {
            return Err(FreeError::NotAllocated);
        }
        self.insert(start, end)
    }

    fn insert(&mut self, start: u64, end: u64) -> Result<(), FreeError> {
        self.ranges.insert(start, end).map_err(|TooFragmented| {
            self.lost += end - start;
            FreeError::Lost(end - start)
        })
    }

    fn return_chunk(&mut self, base: u64) -> Result<(), FreeError> {
        let removed = self.pool.remove_chunk(base);
        debug_assert!(removed);
        self.insert(base, base + CHUNK_SIZE)
    }

    /// Gives every wholly free chunk back to the ranges (before a large allocation that did not
    /// fit, or a question about the largest block).
    pub fn release_empty_chunks(&mut self) -> Result<(), FreeError> {
        while self.pool.empty_chunks() > 0 {
            let Some(base) = self.pool.an_empty_chunk() else { break };
            self.return_chunk(base)?;
        }
        Ok(())
    }

    /// Free bytes, in the ranges and the pool.
    pub fn total(&self) -> u64 {
        self.ranges.total() + self.pool.free_bytes()
    }

    /// Bytes given back that could not be kept (see `FreeError::Lost`).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Chunks lent to the pool.
    pub fn chunks(&self) -> usize {
        self.pool.chunks()
    }

    /// The largest block `allocate(_, align)` can return (`align` a power of two).
    pub fn largest_block(&mut self, align: u64) -> u64 {
        // A failure is counted in `lost`; the block is then not free, and not counted here.
        let _ = self.release_empty_chunks();
        let fit = |range: &Range| (range.end & !(align - 1)).saturating_sub(range.start.next_multiple_of(align));
        let in_ranges = self.ranges.ranges().iter().map(fit).max().unwrap_or(0);
        // The pool serves blocks of up to `MAX_BLOCK_PAGES` from its runs.
        let in_pool = self.pool.free_runs().map(|(start, end)| fit(&Range { start, end })).max().unwrap_or(0);
        in_ranges.max(in_pool.min(MAX_BLOCK_PAGES * PAGE_SIZE))
    }

    /// Runs `f` on each free range: the ranges in order, then the pool's free runs.
    pub fn for_each_free(&self, mut f: impl FnMut(Range)) {
        self.ranges.ranges().iter().copied().for_each(&mut f);
        self.pool.free_runs().for_each(|(start, end)| f(Range { start, end }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const MIB: u64 = 1 << 20;
    /// The property test's memory: ranges of odd sizes and alignments.
    const START: [(u64, u64); 3] = [(MIB + 5 * PAGE_SIZE, 9 * MIB), (10 * MIB, 11 * MIB + 3 * PAGE_SIZE), (12 * MIB, 40 * MIB)];

    fn runs(memory: &FreeMemory<64, 16>) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        memory.for_each_free(|range| runs.push((range.start, range.end)));
        runs
    }

    #[test]
    fn small_blocks_come_from_a_chunk_and_large_ones_from_the_ranges() {
        let mut memory = FreeMemory::<64, 16>::new();
        memory.add(MIB, 64 * MIB).unwrap();
        let page = memory.allocate(PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!(page, 2 * MIB, "the lowest 2 MiB-aligned chunk");
        let big = memory.allocate(4 * MIB, 2 * MIB).unwrap();
        assert_eq!(big, 4 * MIB);
        let odd = memory.allocate(100 * PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!(odd, MIB, "below the chunk, first fit");
        assert_eq!(memory.total(), 63 * MIB - PAGE_SIZE - 4 * MIB - 100 * PAGE_SIZE);
        assert_eq!(memory.largest_block(2 * MIB), 56 * MIB);
        for (start, size) in [(page, PAGE_SIZE), (big, 4 * MIB), (odd, 100 * PAGE_SIZE)] {
            memory.free(start, size).unwrap();
        }
        assert_eq!(memory.chunks(), 1, "one spare chunk kept");
        assert_eq!(memory.total(), 63 * MIB);
        memory.release_empty_chunks().unwrap();
        assert_eq!(runs(&memory), [(MIB, 64 * MIB)]);
    }

    #[test]
    fn a_second_empty_chunk_goes_back() {
        let mut memory = FreeMemory::<64, 16>::new();
        memory.add(0, 16 * MIB).unwrap();
        let stacks: Vec<u64> = (0..65).map(|_| memory.allocate(32 << 10, PAGE_SIZE).unwrap()).collect();
        assert_eq!(memory.chunks(), 2, "64 stacks fill a chunk");
        memory.free(stacks[64], 32 << 10).unwrap();
        assert_eq!(memory.chunks(), 2, "the only empty chunk stays");
        for &stack in &stacks[..64] {
            memory.free(stack, 32 << 10).unwrap();
        }
        assert_eq!(memory.chunks(), 1, "the second empty one went back");
        assert_eq!(memory.free(stacks[64], 32 << 10), Err(FreeError::NotAllocated), "double free");
    }

    #[test]
    fn a_large_block_that_needs_an_empty_chunk_gets_it() {
        let mut memory = FreeMemory::<64, 16>::new();
        memory.add(0, 8 * MIB).unwrap();
        let page = memory.allocate(PAGE_SIZE, PAGE_SIZE).unwrap();
        memory.free(page, PAGE_SIZE).unwrap();
        assert_eq!(memory.chunks(), 1);
        assert_eq!(memory.allocate(8 * MIB, 2 * MIB), Some(0));
        assert_eq!(memory.chunks(), 0);
        assert_eq!(memory.allocate(PAGE_SIZE, PAGE_SIZE), None, "nothing left");
    }

    #[test]
    fn small_blocks_fall_back_to_the_ranges_without_a_chunk() {
        let mut memory = FreeMemory::<64, 16>::new();
        memory.add(MIB, 4 * MIB).unwrap();
        memory.add(5 * MIB + PAGE_SIZE, 6 * MIB).unwrap();
        let big = memory.allocate(2 * MIB, 2 * MIB).unwrap();
        let page = memory.allocate(PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!((big, page, memory.chunks()), (2 * MIB, MIB, 0));
        memory.free(page, PAGE_SIZE).unwrap();
        assert_eq!(memory.allocate(PAGE_SIZE, 3), None, "alignment not a power of two");
    }

    #[test]
    fn lost_memory_is_counted() {
        let mut memory = FreeMemory::<2, 16>::new();
        memory.add(MIB, 2 * MIB).unwrap();
        let blocks: Vec<u64> = (0..5).map(|_| memory.allocate(32 * PAGE_SIZE, PAGE_SIZE).unwrap()).collect();
        // Above them one range is left; a first hole makes two, a second one more than fit.
        memory.free(blocks[0], 32 * PAGE_SIZE).unwrap();
        assert_eq!(memory.free(blocks[2], 32 * PAGE_SIZE), Err(FreeError::Lost(32 * PAGE_SIZE)));
        assert_eq!(memory.lost(), 32 * PAGE_SIZE);
        assert_eq!(memory.free(blocks[1], 32 * PAGE_SIZE), Ok(()), "merges: no new hole");
        assert_eq!(memory.total(), 2 * 32 * PAGE_SIZE + (MIB - 5 * 32 * PAGE_SIZE));
    }

    /// Random allocations and frees of every kind against a model (the blocks handed out):
    /// blocks are aligned, inside the memory, disjoint from each other and from what is free;
    /// free plus allocated is all; nothing is lost; freeing everything gives back the start.
    #[test]
    fn random_use_matches_the_model() {
        let total: u64 = START.iter().map(|(start, end)| end - start).sum();
        for seed in 0..40 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut memory = FreeMemory::<64, 16>::new();
            for (start, end) in START {
                memory.add(start, end).unwrap();
            }
            let mut blocks: Vec<(u64, u64)> = Vec::new();
            for step in 0..3000 {
                if blocks.is_empty() || rng.u32(0..100) < 55 {
                    let (pages, align) = match rng.u32(0..10) {
                        0..=3 => (1, PAGE_SIZE),
                        4..=5 => (8, PAGE_SIZE),
                        6 => (rng.u64(1..=16), PAGE_SIZE << rng.u32(0..5)),
                        7..=8 => (rng.u64(17..600), PAGE_SIZE),
                        _ => (512 * rng.u64(1..4), 2 * MIB),
                    };
                    if let Some(at) = memory.allocate(pages * PAGE_SIZE, align) {
                        assert_eq!(at % align, 0, "seed {seed} step {step}: alignment");
                        blocks.push((at, at + pages * PAGE_SIZE));
                    }
                } else {
                    let (at, end) = blocks.swap_remove(rng.usize(..blocks.len()));
                    memory.free(at, end - at).unwrap();
                    if memory.pool.contains(at) {
                        assert_eq!(memory.free(at, end - at), Err(FreeError::NotAllocated), "seed {seed} step {step}: double free");
                    }
                }
                let used: u64 = blocks.iter().map(|(start, end)| end - start).sum();
                assert_eq!(memory.total() + used, total, "seed {seed} step {step}: nothing lost");
                if step % 100 == 0 {
                    let mut all: Vec<(u64, u64)> = blocks.iter().copied().chain(runs(&memory)).collect();
                    all.sort_unstable();
                    for pair in all.windows(2) {
                        assert!(pair[0].1 <= pair[1].0, "seed {seed} step {step}: overlap {pair:?}");
                    }
                    for (start, end) in all {
                        let inside = START.iter().any(|&(from, to)| from <= start && end <= to);
                        assert!(start < end && inside, "seed {seed} step {step}: outside");
                    }
                }
            }
            for (at, end) in blocks.drain(..) {
                memory.free(at, end - at).unwrap();
            }
            memory.release_empty_chunks().unwrap();
            assert_eq!(runs(&memory), START, "seed {seed}: back to the start");
            assert_eq!((memory.lost(), memory.chunks()), (0, 0));
        }
    }
}
