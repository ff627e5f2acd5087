//! A set of disjoint address ranges kept sorted and merged, in a fixed-size array so the
//! physical memory manager can use it before the heap exists.

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

impl Range {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct TooFragmented;

pub struct RangeSet<const N: usize> {
    ranges: [Range; N],
    len: usize,
}

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

impl<const N: usize> RangeSet<N> {
    pub const fn new() -> Self {
        RangeSet { ranges: [Range { start: 0, end: 0 }; N], len: 0 }
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges[..self.len]
    }

    pub fn total(&self) -> u64 {
        self.ranges().iter().map(Range::len).sum()
    }

    fn insert_at(&mut self, index: usize, range: Range) -> Result<(), TooFragmented> {
        if self.len == N {
            return Err(TooFragmented);
        }
        self.ranges.copy_within(index..self.len, index + 1);
        self.ranges[index] = range;
        self.len += 1;
        Ok(())
    }

    fn remove_at(&mut self, index: usize) {
        self.ranges.copy_within(index + 1..self.len, index);
        self.len -= 1;
    }

    /// Adds `[start, end)`, merging with neighbours; overlapping what is already there is fine.
    pub fn insert(&mut self, start: u64, end: u64) -> Result<(), TooFragmented> {
        if start >= end {
            return Ok(());
        }
        let mut merged = Range { start, end };
        let mut index = 0;
        while index < self.len {
            let range = self.ranges[index];
            if range.end < merged.start {
                index += 1;
            } else if range.start > merged.end {
                break;
            } else {
                merged.start = merged.start.min(range.start);
                merged.end = merged.end.max(range.end);
                self.remove_at(index);
            }
        }
        self.insert_at(index, merged)
    }

    /// Takes `[start, end)` out of the set (parts not in the set are ignored).
    pub fn remove(&mut self, start: u64, end: u64) -> Result<(), TooFragmented> {
        let mut index = 0;
        while index < self.len {
            let range = self.ranges[index];
            if range.end <= start || range.start >= end {
                index += 1;
                continue;
            }
            if range.start < start && range.end > end {
                self.ranges[index].end = start;
                return self.insert_at(index + 1, Range { start: end, end: range.end });
            }
            if range.start < start {
                self.ranges[index].end = start;
                index += 1;
            } else if range.end > end {
                self.ranges[index].start = end;
                index += 1;
            } else {
                self.remove_at(index);
            }
        }
        Ok(())
    }

    pub fn contains(&self, start: u64, end: u64) -> bool {
        self.ranges().iter().any(|range| range.start <= start && end <= range.end)
    }

    /// True if no part of `[start, end)` is in the set.
    pub fn is_disjoint(&self, start: u64, end: u64) -> bool {
        self.ranges().iter().all(|range| range.end <= start || range.start >= end)
    }

    /// Takes `size` bytes aligned to `align` from the lowest range that fits.
    pub fn take_lowest(&mut self, size: u64, align: u64) -> Option<u64> {
        let start = self.ranges().iter().find_map(|range| {
            let start = align_up(range.start, align);
            (start.checked_add(size)? <= range.end).then_some(start)
        })?;
        self.remove(start, start + size).ok()?;
        Some(start)
    }

    /// The parts of `[start, end)` that are *not* in the set, in order.
    pub fn gaps(&self, start: u64, end: u64) -> impl Iterator<Item = Range> + '_ {
        let mut cursor = start;
        let mut ranges = self.ranges().iter();
        core::iter::from_fn(move || {
            while cursor < end {
                match ranges.next() {
                    Some(range) if range.end <= cursor => continue,
                    Some(range) if range.start < end => {
                        let gap = Range { start: cursor, end: range.start.min(end) };
                        cursor = range.end;
                        if gap.start < gap.end {
                            return Some(gap);
                        }
                    }
                    _ => {
                        let gap = Range { start: cursor, end };
                        cursor = end;
                        return Some(gap);
                    }
                }
            }
            None
        })
    }
}
