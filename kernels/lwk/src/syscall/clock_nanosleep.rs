//! clock_nanosleep(clock, flags, req, rem): relative or TIMER_ABSTIME sleeps on the real-time
//! and monotonic clocks (every clock but REALTIME counts from boot here).

use super::clock_gettime::nanoseconds_of;
use super::{user, Call, Errno, SyscallResult};
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

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [clock_id, flags, request, ..] = call.args;
    let now_on_clock = nanoseconds_of(clock_id)?;
    let time = read_duration(request)?;
    let duration = if flags & TIMER_ABSTIME != 0 { time.saturating_sub(now_on_clock) } else { time };
    sched::sleep_until(clock::monotonic_ns().saturating_add(duration));
    Ok(0)
}
