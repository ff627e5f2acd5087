//! The ids an enclave gives its threads and forked processes.
//!
//! A job's first process takes its `clowder run`'s host pid, but the threads and processes the
//! job makes are numbered by the enclave. Those numbers must not meet any other process's pid on
//! the node: Open MPI's shared memory takes a segment whose creator has the caller's pid for the
//! caller's own, and programs name files in the shared /tmp and /dev/shm after their pid. So each
//! enclave of a node numbers from its own block, given by clowderd (`lwk.id_block=N`), above
//! Linux's largest pid (`PID_MAX_LIMIT`, so none meets a host pid) and below 2^30 (the most a
//! futex lock word holds, `FUTEX_TID_MASK`). Within its block an enclave wraps around and skips
//! the ids still in use, as Linux does at `pid_max`.

/// Linux's largest pid (`PID_MAX_LIMIT` on 64-bit): the first id a block may hold.
pub const FIRST_KERNEL_ID: u64 = 1 << 22;
/// One past the largest thread id a futex word can hold (`FUTEX_TID_MASK` + 1).
pub const FUTEX_TID_LIMIT: u64 = 1 << 30;
/// The ids in one enclave's block.
pub const IDS_PER_BLOCK: u64 = 1 << 20;
/// How many enclaves of a node can have a block of their own.
pub const BLOCKS: u64 = (FUTEX_TID_LIMIT - FIRST_KERNEL_ID) / IDS_PER_BLOCK;

/// Hands out the ids of one block, the lowest first, wrapping around past the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdBlock {
    first: u64,
    next: u64,
}

impl IdBlock {
    /// Block 0, an enclave's until clowderd gives it another.
    pub const ZERO: IdBlock = IdBlock { first: FIRST_KERNEL_ID, next: FIRST_KERNEL_ID };

    /// Block `index` (`None` past [`BLOCKS`]).
    pub const fn new(index: u64) -> Option<IdBlock> {
        if index >= BLOCKS {
            return None;
        }
        let first = FIRST_KERNEL_ID + index * IDS_PER_BLOCK;
        Some(IdBlock { first, next: first })
    }

    /// The block's first id.
    pub const fn first(&self) -> u64 {
        self.first
    }

    /// Whether `id` belongs to this block.
    pub const fn holds(&self, id: u64) -> bool {
        id >= self.first && id < self.first + IDS_PER_BLOCK
    }

    /// Starts over from the block's first id (an enclave's next job, none of the last one's
    /// ids being in use any more).
    pub fn restart(&mut self) {
        self.next = self.first;
    }

    /// The next id that `in_use` says is free, or `None` when every id of the block is in use.
    /// Costs one `in_use` call per id in use that it passes over.
    pub fn take(&mut self, in_use: impl Fn(u64) -> bool) -> Option<u64> {
        for _ in 0..IDS_PER_BLOCK {
            let id = self.next;
            self.next = if id + 1 == self.first + IDS_PER_BLOCK { self.first } else { id + 1 };
            if !in_use(id) {
                return Some(id);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn blocks_lie_between_linux_pids_and_the_futex_limit_without_overlap() {
        let first = IdBlock::new(0).unwrap();
        assert_eq!(first, IdBlock::ZERO);
        assert_eq!(first.first(), FIRST_KERNEL_ID);
        let last = IdBlock::new(BLOCKS - 1).unwrap();
        assert_eq!(last.first() + IDS_PER_BLOCK, FUTEX_TID_LIMIT);
        assert_eq!(IdBlock::new(BLOCKS), None);
        let second = IdBlock::new(1).unwrap();
        assert!(!first.holds(second.first()) && first.holds(second.first() - 1));
        assert!(!second.holds(first.first()));
    }

    #[test]
    fn ids_come_in_order_and_wrap_around_past_those_in_use() {
        let mut block = IdBlock::new(3).unwrap();
        let start = block.first();
        assert_eq!(block.take(|_| false), Some(start));
        assert_eq!(block.take(|_| false), Some(start + 1));
        // Near the end: the last id, then the first ones again, skipping those still in use.
        block.next = start + IDS_PER_BLOCK - 1;
        assert_eq!(block.take(|_| false), Some(start + IDS_PER_BLOCK - 1));
        let in_use = |id| id == start || id == start + 1;
        assert_eq!(block.take(in_use), Some(start + 2));
        block.restart();
        assert_eq!(block.take(|_| false), Some(start));
    }

    #[test]
    fn a_full_block_gives_none() {
        let mut block = IdBlock::new(0).unwrap();
        assert_eq!(block.take(|_| true), None);
    }

    #[test]
    fn taken_ids_stay_in_the_block_and_never_repeat_while_in_use() {
        // A seeded walk of takes and releases against the set of ids in use, across the wrap.
        let mut block = IdBlock::new(7).unwrap();
        block.next = block.first() + IDS_PER_BLOCK - 5_000;
        let mut live = BTreeSet::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed % 3 == 0 && !live.is_empty() {
                let victim = *live.iter().nth((seed as usize / 3) % live.len()).unwrap();
                live.remove(&victim);
            } else {
                let id = block.take(|id| live.contains(&id)).unwrap();
                assert!(block.holds(id), "{id:#x}");
                assert!(live.insert(id), "{id:#x} handed out twice");
            }
        }
    }
}
