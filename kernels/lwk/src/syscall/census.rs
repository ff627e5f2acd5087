//! Counts of the job's kernel entries, logged in the enclave's log (`clowder logs ENCLAVE`) at
//! the job's end: system calls by number (those the ring-3 fast path answers never get here),
//! timer ticks (with the TLB-shootdown IPIs that share their vector) and page faults from user
//! mode. On PVM every entry costs about 100 us of emulated kernel code, so this is where a
//! job's kernel time goes (issue 25: what an MPI rank asks per CG iteration). Counts are the
//! enclave's since the last job started: jobs running side by side in one enclave share them.

use super::names;
use crate::console::log;
use core::sync::atomic::{AtomicU64, Ordering};

/// Numbers 0..=462 (Linux's table); anything above is counted in the last slot.
const NUMBERS: usize = 464;

static CALLS: [AtomicU64; NUMBERS] = [const { AtomicU64::new(0) }; NUMBERS];
static TICKS: AtomicU64 = AtomicU64::new(0);
static USER_FAULTS: AtomicU64 = AtomicU64::new(0);

/// How many of the most frequent calls the report names.
const NAMED: usize = 12;

#[inline(always)]
pub fn count_call(number: u64) {
    CALLS[(number as usize).min(NUMBERS - 1)].fetch_add(1, Ordering::Relaxed);
}

#[inline(always)]
pub fn count_tick() {
    TICKS.fetch_add(1, Ordering::Relaxed);
}

#[inline(always)]
pub fn count_user_fault() {
    USER_FAULTS.fetch_add(1, Ordering::Relaxed);
}

/// Starts the counts anew (a job starts).
pub fn reset() {
    for count in &CALLS {
        count.store(0, Ordering::Relaxed);
    }
    TICKS.store(0, Ordering::Relaxed);
    USER_FAULTS.store(0, Ordering::Relaxed);
}

/// The most frequent calls, most first, ties by number: up to `NAMED` of (number, count).
fn most_frequent() -> ([(usize, u64); NAMED], usize) {
    let mut top = [(0usize, 0u64); NAMED];
    let mut len = 0;
    for (number, count) in CALLS.iter().enumerate() {
        let count = count.load(Ordering::Relaxed);
        if count == 0 {
            continue;
        }
        // Insertion into the sorted prefix: the table is small and this runs once per job.
        let place = top[..len].iter().position(|&(_, c)| c < count).unwrap_or(len);
        if place == NAMED {
            continue;
        }
        len = (len + 1).min(NAMED);
        top.copy_within(place..len - 1, place + 1);
        top[place] = (number, count);
    }
    (top, len)
}

/// Logs the counts in two lines: the totals, then the most frequent calls by name.
pub fn report() {
    let total: u64 = CALLS.iter().map(|count| count.load(Ordering::Relaxed)).sum();
    let (top, len) = most_frequent();
    log!(
        "job's kernel entries: {} system calls ({} kinds), {} timer ticks, {} page faults from user mode",
        total,
        CALLS.iter().filter(|count| count.load(Ordering::Relaxed) != 0).count(),
        TICKS.load(Ordering::Relaxed),
        USER_FAULTS.load(Ordering::Relaxed)
    );
    let mut line = alloc::string::String::new();
    for &(number, count) in &top[..len] {
        use core::fmt::Write;
        let _ = write!(line, " {} {}", names::name_of(number as u64), count);
    }
    log!("job's most frequent system calls:{}", line);
}
