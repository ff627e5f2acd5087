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

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
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

impl<const N: usize> Default for RangeSet<N> {
    fn default() -> Self {
        Self::new()
    }
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
                // Checked before the range is cut, so that a full set loses nothing.
                if self.len == N {
                    return Err(TooFragmented);
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn set(ranges: &[(u64, u64)]) -> RangeSet<4> {
        let mut set = RangeSet::new();
        for &(start, end) in ranges {
            set.insert(start, end).unwrap();
        }
        set
    }

    fn pairs(set: &RangeSet<4>) -> Vec<(u64, u64)> {
        set.ranges().iter().map(|range| (range.start, range.end)).collect()
    }

    #[test]
    fn insert_keeps_ranges_sorted_and_merged() {
        assert_eq!(pairs(&set(&[(30, 40), (10, 20)])), [(10, 20), (30, 40)]);
        assert_eq!(pairs(&set(&[(10, 20), (20, 30)])), [(10, 30)], "touching ranges merge");
        assert_eq!(pairs(&set(&[(10, 20), (30, 40), (15, 35)])), [(10, 40)], "a bridge merges both");
        assert_eq!(pairs(&set(&[(10, 20), (12, 18)])), [(10, 20)], "overlap is fine");
        assert_eq!(pairs(&set(&[(10, 10)])), [], "empty ranges are nothing");
        assert_eq!(set(&[(0, 4096), (8192, 12288)]).total(), 8192);
    }

    #[test]
    fn a_full_set_says_so() {
        let mut full = set(&[(0, 1), (2, 3), (4, 5), (6, 7)]);
        assert_eq!(full.insert(8, 9), Err(TooFragmented));
        assert_eq!(full.remove(10, 20), Ok(()), "nothing to split");
        let mut split = set(&[(0, 100), (200, 201), (300, 301), (400, 401)]);
        assert_eq!(split.remove(10, 20), Err(TooFragmented));
        assert_eq!(split.total(), 103, "nothing cut off");
    }

    #[test]
    fn remove_trims_splits_and_drops() {
        let mut ranges = set(&[(0, 100), (200, 300)]);
        ranges.remove(50, 250).unwrap();
        assert_eq!(pairs(&ranges), [(0, 50), (250, 300)]);
        ranges.remove(260, 270).unwrap();
        assert_eq!(pairs(&ranges), [(0, 50), (250, 260), (270, 300)]);
        ranges.remove(0, 1000).unwrap();
        assert_eq!(pairs(&ranges), []);
    }

    #[test]
    fn queries() {
        let ranges = set(&[(0, 100), (200, 300)]);
        assert!(ranges.contains(10, 90) && ranges.contains(200, 300));
        assert!(!ranges.contains(90, 210));
        assert!(ranges.is_disjoint(100, 200) && !ranges.is_disjoint(99, 200));
        let gaps: Vec<(u64, u64)> = ranges.gaps(50, 400).map(|gap| (gap.start, gap.end)).collect();
        assert_eq!(gaps, [(100, 200), (300, 400)]);
        assert_eq!(ranges.gaps(0, 100).count(), 0);
    }

    #[test]
    fn take_lowest_aligns_and_skips_what_is_too_small() {
        let mut ranges = set(&[(100, 200), (4096, 3 * 4096)]);
        assert_eq!(ranges.take_lowest(4096, 4096), Some(4096));
        assert_eq!(ranges.take_lowest(50, 1), Some(100));
        assert_eq!(pairs(&ranges), [(150, 200), (8192, 3 * 4096)]);
        assert_eq!(ranges.take_lowest(1 << 20, 4096), None);
        assert_eq!(ranges.take_lowest(u64::MAX, 1), None, "no overflow");
    }
}
