//! clock_gettime(clock, tp): REALTIME from the RTC read at boot plus the TSC; every other
//! clock (MONOTONIC, BOOTTIME, the CPU-time clocks of the job's single thread) counts from
//! boot.

use super::{user, Call, Errno, SyscallResult};
use crate::clock;

const CLOCK_REALTIME: u64 = 0;
const CLOCK_REALTIME_COARSE: u64 = 5;
const CLOCK_TAI: u64 = 11;

pub fn nanoseconds_of(clock_id: u64) -> Result<u64, Errno> {
    match clock_id {
        CLOCK_REALTIME | CLOCK_REALTIME_COARSE | CLOCK_TAI => Ok(clock::realtime_ns()),
        0..=11 => Ok(clock::monotonic_ns()),
        _ => Err(Errno::EINVAL),
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let nanoseconds = nanoseconds_of(call.args[0])?;
    user::write_words(call.args[1], &[nanoseconds / 1_000_000_000, nanoseconds % 1_000_000_000])?;
    Ok(0)
}
