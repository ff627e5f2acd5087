//! Small blocks of pages (page-table pages, kernel stacks, the kernel heap's page runs): 2 MiB
//! chunks taken from the free ranges, each with a bitmap of its 512 pages, found by a hash of
//! the address. Taking or giving back a block of up to 16 pages costs a bounded number of
//! steps (a few probes, a few bitmap words), instead of a walk and a shift of the whole range
//! set (emulated kernel instructions on PVM). Fixed-size, so it works before the heap exists.

pub const PAGE_SIZE: u64 = 4096;
/// The memory of one chunk, aligned to itself (a 2 MiB page, so a chunk never splits a huge
/// page of job memory that it does not take whole).
pub const CHUNK_SIZE: u64 = 2 << 20;
const CHUNK_PAGES: u64 = CHUNK_SIZE / PAGE_SIZE;
const WORDS: usize = (CHUNK_PAGES / 64) as usize;
/// The largest block (in pages, and its alignment) kept in chunks: bigger ones use the ranges.
pub const MAX_BLOCK_PAGES: u64 = 16;
/// Slots probed for a chunk after its hashed one: lookups check all of them, so removing a
/// chunk needs no tombstone.
const PROBES: usize = 4;
/// Blocks are placed at a multiple of their size rounded up to a power of two (buddy-like),
/// one hint per such class: 1, 2, 4, 8, 16 pages.
const CLASSES: usize = 5;

/// What `PagePool::free` did with a block.
#[derive(Debug, PartialEq, Eq)]
pub enum Freed {
    /// The block is not in a chunk of the pool: nothing changed.
    NotInPool,
    /// Back in its chunk.
    Kept,
    /// Back in its chunk, which is now wholly free (it stays in the pool: the caller decides
    /// whether to take it out); the chunk's base.
    Emptied(u64),
    /// In a chunk, but not a block the pool handed out: not page-aligned, crossing a bitmap
    /// word (no block does), or (part of it) free already. Nothing changed.
    NotAllocated,
}

#[derive(Clone, Copy)]
struct Chunk {
    /// The end of the chunk's memory, 0 for an unused slot (so the pool starts as zeroes, in
    /// the kernel's .bss).
    end: u64,
    /// Bit `i` of word `w`: page `64 * w + i` is free.
    free: [u64; WORDS],
    free_pages: u64,
}

const UNUSED: u64 = 0;

impl Chunk {
    fn base(&self) -> u64 {
        self.end - CHUNK_SIZE
    }
}

/// Up to `N` chunks (`N` a power of two, so that the hash is a mask).
pub struct PagePool<const N: usize> {
    slots: [Chunk; N],
    chunks: usize,
    /// How many chunks are wholly free.
    empty: usize,
    /// Per class, the slot that last had room for such a block.
    hints: [usize; CLASSES],
}

impl<const N: usize> Default for PagePool<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The block of `pages` pages (1 to `MAX_BLOCK_PAGES`) and its alignment in pages, as a class.
fn class_of(pages: u64, align_pages: u64) -> usize {
    pages.next_power_of_two().max(align_pages).trailing_zeros() as usize
}

/// Per class, every bit where a block of the class may start (every 1, 2, 4, 8, 16 bits).
const STARTS: [u64; CLASSES] = [u64::MAX, 0x5555_5555_5555_5555, 0x1111_1111_1111_1111, 0x0101_0101_0101_0101, 0x0001_0001_0001_0001];

/// Bits `i` of `free` from which `pages` bits are free, for `i` where the class's blocks may
/// start (`pages` at most 16, so a block never crosses a word).
#[inline]
fn fits(free: u64, pages: u64, class: usize) -> u64 {
    let mut runs = free;
    for shift in 1..pages {
        runs &= free >> shift;
    }
    runs & STARTS[class]
}

fn mask(pages: u64, at: u64) -> u64 {
    (u64::MAX >> (64 - pages)) << at
}

impl<const N: usize> PagePool<N> {
    pub const fn new() -> Self {
        assert!(N.is_power_of_two() && N >= PROBES);
        PagePool { slots: [Chunk { end: UNUSED, free: [0; WORDS], free_pages: 0 }; N], chunks: 0, empty: 0, hints: [0; CLASSES] }
    }

    /// Whether a block of `size` bytes aligned to `align` is one the pool keeps.
    pub fn takes(size: u64, align: u64) -> bool {
        size > 0
            && size % PAGE_SIZE == 0
            && size <= MAX_BLOCK_PAGES * PAGE_SIZE
            && align.is_power_of_two()
            && align <= MAX_BLOCK_PAGES * PAGE_SIZE
    }

    fn home(base: u64) -> usize {
        (base / CHUNK_SIZE) as usize & (N - 1)
    }

    fn probes(base: u64) -> impl Iterator<Item = usize> {
        let home = Self::home(base);
        (0..PROBES).map(move |probe| (home + probe) & (N - 1))
    }

    /// The slot of the chunk holding `address`.
    #[inline]
    fn slot_of(&self, address: u64) -> Option<usize> {
        let base = address / CHUNK_SIZE * CHUNK_SIZE;
        let end = base.checked_add(CHUNK_SIZE)?;
        Self::probes(base).find(|&slot| self.slots[slot].end == end)
    }

    pub fn contains(&self, address: u64) -> bool {
        self.slot_of(address).is_some()
    }

    /// Adds the free chunk at `base` (aligned to `CHUNK_SIZE`); false if its slots are all taken
    /// (the caller keeps the memory).
    pub fn add_chunk(&mut self, base: u64) -> bool {
        debug_assert!(base % CHUNK_SIZE == 0);
        let Some(end) = base.checked_add(CHUNK_SIZE) else { return false };
        let Some(slot) = Self::probes(base).find(|&slot| self.slots[slot].end == UNUSED) else { return false };
        self.slots[slot] = Chunk { end, free: [u64::MAX; WORDS], free_pages: CHUNK_PAGES };
        self.chunks += 1;
        self.empty += 1;
        true
    }

    /// Takes a block of `pages` pages (1 to `MAX_BLOCK_PAGES`) aligned to `align_pages` pages (a
    /// power of two, at most `MAX_BLOCK_PAGES`) from a chunk that has room; `None` if none has.
    /// The chunk that last had room for the class is tried first, then the slots in order up
    /// to the last chunk.
    pub fn allocate(&mut self, pages: u64, align_pages: u64) -> Option<u64> {
        let class = class_of(pages, align_pages);
        if let Some(start) = self.take_from(self.hints[class], pages, class) {
            return Some(start);
        }
        let mut seen = 0;
        for slot in 0..N {
            if seen == self.chunks {
                break;
            }
            seen += usize::from(self.slots[slot].end != UNUSED);
            if let Some(start) = self.take_from(slot, pages, class) {
                self.hints[class] = slot;
                return Some(start);
            }
        }
        None
    }

    /// A block of `pages` pages of `class` from the chunk in `slot`, if it has room.
    #[inline]
    fn take_from(&mut self, slot: usize, pages: u64, class: usize) -> Option<u64> {
        let chunk = &mut self.slots[slot];
        if chunk.end == UNUSED || chunk.free_pages < pages {
            return None;
        }
        for word in 0..WORDS {
            let starts = fits(chunk.free[word], pages, class);
            if starts != 0 {
                let at = u64::from(starts.trailing_zeros());
                let was_empty = chunk.free_pages == CHUNK_PAGES;
                chunk.free[word] &= !mask(pages, at);
                chunk.free_pages -= pages;
                let start = chunk.base() + (word as u64 * 64 + at) * PAGE_SIZE;
                self.empty -= usize::from(was_empty);
                return Some(start);
            }
        }
        None
    }

    /// Gives back `size` bytes at `start`, if they are in the pool.
    pub fn free(&mut self, start: u64, size: u64) -> Freed {
        let Some(slot) = self.slot_of(start) else { return Freed::NotInPool };
        let chunk = &mut self.slots[slot];
        let (first, pages) = ((start - chunk.base()) / PAGE_SIZE, size / PAGE_SIZE);
        let (word, at) = ((first / 64) as usize, first % 64);
        if start % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 || pages == 0 || at + pages > 64 {
            return Freed::NotAllocated;
        }
        let bits = mask(pages, at);
        if chunk.free[word] & bits != 0 {
            return Freed::NotAllocated;
        }
        chunk.free[word] |= bits;
        chunk.free_pages += pages;
        if chunk.free_pages < CHUNK_PAGES {
            return Freed::Kept;
        }
        let base = chunk.base();
        self.empty += 1;
        Freed::Emptied(base)
    }

    /// Takes the wholly free chunk at `base` out of the pool (false if it is not one).
    pub fn remove_chunk(&mut self, base: u64) -> bool {
        match self.slot_of(base) {
            Some(slot) if self.slots[slot].free_pages == CHUNK_PAGES => {
                self.slots[slot].end = UNUSED;
                self.chunks -= 1;
                self.empty -= 1;
                true
            }
            _ => false,
        }
    }

    /// The base of a wholly free chunk, if there is one (a walk of the slots).
    pub fn an_empty_chunk(&self) -> Option<u64> {
        self.slots.iter().find(|chunk| chunk.end != UNUSED && chunk.free_pages == CHUNK_PAGES).map(Chunk::base)
    }

    /// How many chunks are wholly free.
    pub fn empty_chunks(&self) -> usize {
        self.empty
    }

    pub fn chunks(&self) -> usize {
        self.chunks
    }

    pub fn free_bytes(&self) -> u64 {
        self.slots.iter().filter(|chunk| chunk.end != UNUSED).map(|chunk| chunk.free_pages * PAGE_SIZE).sum()
    }

    /// Each run of free pages as `(start, end)`, chunk by chunk (runs end at word boundaries).
    pub fn free_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots.iter().filter(|chunk| chunk.end != UNUSED).flat_map(|chunk| {
            chunk.free.iter().enumerate().flat_map(move |(word, &bits)| {
                let base = chunk.base() + word as u64 * 64 * PAGE_SIZE;
                let mut rest = bits;
                core::iter::from_fn(move || {
                    if rest == 0 {
                        return None;
                    }
                    let at = u64::from(rest.trailing_zeros());
                    let len = u64::from((!(rest >> at)).trailing_zeros());
                    rest &= !mask(len, at);
                    Some((base + at * PAGE_SIZE, base + (at + len) * PAGE_SIZE))
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const BASE: u64 = 64 * CHUNK_SIZE;

    #[test]
    fn blocks_are_placed_at_their_size_and_alignment() {
        let mut pool = PagePool::<8>::new();
        assert_eq!(pool.allocate(1, 1), None, "no chunk yet");
        assert!(pool.add_chunk(BASE));
        assert_eq!(pool.allocate(1, 1), Some(BASE));
        assert_eq!(pool.allocate(8, 1), Some(BASE + 8 * PAGE_SIZE), "a stack at a multiple of 8 pages");
        assert_eq!(pool.allocate(1, 1), Some(BASE + PAGE_SIZE));
        assert_eq!(pool.allocate(3, 1), Some(BASE + 4 * PAGE_SIZE), "3 pages at a multiple of 4");
        assert_eq!(pool.allocate(1, 16), Some(BASE + 16 * PAGE_SIZE), "alignment honoured");
        assert_eq!(pool.allocate(16, 16), Some(BASE + 32 * PAGE_SIZE));
        assert_eq!(pool.free_bytes(), (512 - 1 - 8 - 1 - 3 - 1 - 16) * PAGE_SIZE);
        assert_eq!(pool.empty_chunks(), 0);
    }

    #[test]
    fn a_full_chunk_says_none_and_frees_coalesce() {
        let mut pool = PagePool::<8>::new();
        assert!(pool.add_chunk(BASE));
        let stacks: Vec<u64> = (0..64).map(|_| pool.allocate(8, 1).unwrap()).collect();
        assert_eq!(pool.allocate(1, 1), None);
        for (i, &stack) in stacks.iter().enumerate() {
            let freed = pool.free(stack, 8 * PAGE_SIZE);
            assert_eq!(freed, if i == 63 { Freed::Emptied(BASE) } else { Freed::Kept }, "wholly free after the last");
        }
        assert_eq!(pool.free_runs().collect::<Vec<_>>().len(), 8, "one run per word");
        assert!(pool.remove_chunk(BASE) && pool.chunks() == 0 && !pool.contains(BASE));
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let mut pool = PagePool::<8>::new();
        assert!(pool.add_chunk(BASE));
        let page = pool.allocate(2, 1).unwrap();
        assert_eq!(pool.free(page, 3 * PAGE_SIZE), Freed::NotAllocated, "part of it was free");
        assert_eq!(pool.free(page + 1, PAGE_SIZE), Freed::NotAllocated, "not page-aligned");
        assert_eq!(pool.free(page, 100), Freed::NotAllocated, "not pages");
        assert_eq!(pool.free(BASE + CHUNK_SIZE, PAGE_SIZE), Freed::NotInPool);
        assert_eq!(pool.free(BASE + 63 * PAGE_SIZE, 2 * PAGE_SIZE), Freed::NotAllocated, "crosses a word: never allocated");
        assert!(!pool.remove_chunk(BASE), "not wholly free");
        assert_eq!(pool.free(page, 2 * PAGE_SIZE), Freed::Emptied(BASE));
        assert_eq!(pool.free(page, PAGE_SIZE), Freed::NotAllocated, "a double free");
    }

    #[test]
    fn colliding_chunks_probe_and_run_out_of_slots() {
        let mut pool = PagePool::<4>::new();
        // All hash to slot 0 of 4; four probes fit them all, a fifth is refused.
        for i in 0..4 {
            assert!(pool.add_chunk(BASE + i * 4 * CHUNK_SIZE));
        }
        assert!(!pool.add_chunk(BASE + 16 * CHUNK_SIZE));
        assert!(pool.contains(BASE + 12 * CHUNK_SIZE + 5) && !pool.contains(BASE + CHUNK_SIZE));
        assert!(!pool.contains(u64::MAX) && !pool.contains(0), "the top of memory, and unused slots");
        assert!(pool.remove_chunk(BASE + 4 * CHUNK_SIZE));
        assert!(pool.contains(BASE + 12 * CHUNK_SIZE), "found past the emptied slot");
        assert_eq!(pool.chunks(), 3);
        assert_eq!(pool.empty_chunks(), 3);
    }

    #[test]
    fn what_the_pool_takes() {
        assert!(PagePool::<4>::takes(PAGE_SIZE, PAGE_SIZE));
        assert!(PagePool::<4>::takes(64 << 10, 4096));
        assert!(!PagePool::<4>::takes(68 << 10, 4096), "too big");
        assert!(!PagePool::<4>::takes(4096, 128 << 10), "aligned beyond a block");
        assert!(!PagePool::<4>::takes(100, 1), "not pages");
        assert!(!PagePool::<4>::takes(0, 4096));
    }
}
