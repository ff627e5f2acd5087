//! clock_nanosleep(clock, flags, req, rem): relative or TIMER_ABSTIME sleeps on the real-time
//! and monotonic clocks (every clock but REALTIME counts from boot here). A signal ends a
//! sleep as on Linux: a relative one writes the remaining time to `rem` and returns EINTR once
//! a handler runs; an absolute one returns EINTR once a handler runs.

use super::clock_gettime::nanoseconds_of;
use super::{user, Call, Errno, SyscallResult};
use crate::signal::Restart;
use crate::{clock, sched};

const TIMER_ABSTIME: u64 = 1;

/// A `struct timespec` duration in nanoseconds.
pub fn read_duration(address: u64) -> Result<u64, Errno> {
    let [seconds, nanoseconds] = user::read_words::<2>(address)?;
    if nanoseconds >= 1_000_000_000 || (seconds as i64) < 0 {
        return Err(Errno::EINVAL);
    }
    Ok(seconds.saturating_mul(1_000_000_000).saturating_add(nanoseconds))
}

/// Sleeps `duration` ns; if a signal ends the sleep first, writes the remaining time to
/// `remaining` (unless 0) and returns the restart code Linux gives relative sleeps.
pub fn sleep_relative(duration: u64, remaining: u64) -> SyscallResult {
    let deadline = clock::monotonic_ns().saturating_add(duration);
    if sched::sleep_until(deadline) {
        return Ok(0);
    }
    let left = deadline.saturating_sub(clock::monotonic_ns());
    if left == 0 {
        return Ok(0);
    }
    if remaining != 0 {
        user::write_words(remaining, &[left / 1_000_000_000, left % 1_000_000_000])?;
    }
    Err(Restart::Block.errno())
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [clock_id, flags, request, remaining, ..] = call.args;
    let now_on_clock = nanoseconds_of(clock_id)?;
    let time = read_duration(request)?;
    if flags & TIMER_ABSTIME == 0 {
        return sleep_relative(time, remaining);
    }
    // An absolute sleep leaves `rem` alone and is restarted only when no handler runs.
    if sched::sleep_until(clock::monotonic_ns().saturating_add(time.saturating_sub(now_on_clock))) {
        Ok(0)
    } else {
        Err(Restart::NoHandler.errno())
    }
}
