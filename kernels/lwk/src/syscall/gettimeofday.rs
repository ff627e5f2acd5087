//! gettimeofday(tv, tz): wall time in microseconds; the time zone is UTC.

use super::{user, Call, SyscallResult};
use crate::clock;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [time, zone, ..] = call.args;
    let nanoseconds = clock::realtime_ns();
    if time != 0 {
        user::write_words(time, &[nanoseconds / 1_000_000_000, nanoseconds % 1_000_000_000 / 1000])?;
    }
    if zone != 0 {
        user::write_bytes(zone, &[0; 8])?;
    }
    Ok(0)
}
