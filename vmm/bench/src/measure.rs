//! What both benchmark binaries (vmm-bench and lwk-bench, which includes this file by path)
//! measure with: the monotonic clock and the median of repeated runs.

/// The median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u128 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes into t.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}
