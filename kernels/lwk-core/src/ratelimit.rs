//! A budget for a kind of repeated log line (the scheduler's stall notes): at most `burst`
//! lines in a window of `window_ns`, the rest counted and the count given with the next line
//! let through, as Linux's `printk_ratelimit` does ("N callbacks suppressed").
//!
//! Why it matters here: each kernel line is console output the hypervisor emulates, and on
//! PVM the formatting runs as emulated kernel code, so an overloaded enclave that notes every
//! long wait made itself slower still: the 2,000-line log of an overloaded
//! `killed_process_trees` enclave was nothing but stall notes, and pushed the lines that
//! mattered out of the daemon's log.

/// Whether a line may be logged now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, saying that `left_out` lines of its kind were left out before it.
    Log { left_out: u64 },
    /// Leave it out (counted).
    LeaveOut,
}

/// At most `burst` lines in each window of `window_ns`, a window beginning at the first line
/// after the previous one ended.
#[derive(Debug, Clone)]
pub struct LogBudget {
    burst: u32,
    window_ns: u64,
    window_start: Option<u64>,
    used: u32,
    left_out: u64,
}

impl LogBudget {
    pub const fn new(burst: u32, window_ns: u64) -> Self {
        LogBudget { burst, window_ns, window_start: None, used: 0, left_out: 0 }
    }

    /// The verdict on a line at `now_ns` (a monotonic clock; one that steps back is taken as
    /// still in the current window).
    pub fn admit(&mut self, now_ns: u64) -> Verdict {
        let window_over = match self.window_start {
            Some(start) => now_ns.saturating_sub(start) >= self.window_ns,
            None => true,
        };
        if window_over {
            self.window_start = Some(now_ns);
            self.used = 0;
        }
        if self.used < self.burst {
            self.used += 1;
            Verdict::Log { left_out: core::mem::take(&mut self.left_out) }
        } else {
            self.left_out += 1;
            Verdict::LeaveOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_burst_passes_then_lines_are_counted_until_the_window_ends() {
        let mut budget = LogBudget::new(3, 10 * SECOND);
        let verdicts: Vec<Verdict> = (0..5).map(|i| budget.admit(100 + i)).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Log { left_out: 0 },
                Verdict::Log { left_out: 0 },
                Verdict::Log { left_out: 0 },
                Verdict::LeaveOut,
                Verdict::LeaveOut
            ]
        );
        // Still the first window: left out.
        assert_eq!(budget.admit(100 + 10 * SECOND - 1), Verdict::LeaveOut);
        // The next window's first line tells how many were left out, once.
        assert_eq!(budget.admit(100 + 10 * SECOND), Verdict::Log { left_out: 3 });
        assert_eq!(budget.admit(100 + 10 * SECOND + 1), Verdict::Log { left_out: 0 });
    }

    #[test]
    fn a_clock_that_steps_back_stays_in_the_window() {
        let mut budget = LogBudget::new(1, SECOND);
        assert_eq!(budget.admit(5 * SECOND), Verdict::Log { left_out: 0 });
        assert_eq!(budget.admit(SECOND), Verdict::LeaveOut);
        assert_eq!(budget.admit(6 * SECOND), Verdict::Log { left_out: 1 });
    }

    #[test]
    fn a_zero_burst_logs_nothing_and_counts_everything() {
        let mut budget = LogBudget::new(0, SECOND);
        assert!((0..100).all(|i| budget.admit(i * SECOND) == Verdict::LeaveOut));
    }

    #[test]
    fn a_seeded_walk_never_exceeds_the_burst_in_a_window_and_loses_no_count() {
        let (burst, window) = (4u32, 1_000u64);
        let mut budget = LogBudget::new(burst, window);
        let (mut now, mut seed) = (0u64, 0x9e37_79b9_7f4a_7c15u64);
        let mut logged_at: Vec<u64> = Vec::new();
        let (mut left_out, mut reported) = (0u64, 0u64);
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            now += seed % 400;
            match budget.admit(now) {
                Verdict::Log { left_out: count } => {
                    reported += count;
                    logged_at.push(now);
                }
                Verdict::LeaveOut => left_out += 1,
            }
        }
        // Every count reported belongs to a line left out, and what is not yet reported
        // is what the budget still holds.
        assert_eq!(reported + budget.left_out, left_out);
        // A span shorter than a window meets at most two windows (as with Linux's limit, a
        // burst may end one and begin the next), so any `2 * burst + 1` lines span a window.
        let most = 2 * burst as usize;
        for lines in logged_at.windows(most + 1) {
            assert!(lines[most] - lines[0] >= window, "{lines:?}");
        }
        assert!(left_out > 0 && logged_at.len() > 1_000, "the walk tested both verdicts");
    }
}
