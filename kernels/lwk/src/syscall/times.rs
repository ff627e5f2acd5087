//! times(buf): the job's time since it started as user time, in clock ticks (100 per
//! second); returns ticks since boot.

use super::{user, Call, SyscallResult};
use crate::{clock, job};

const TICKS_PER_SECOND: u64 = 100;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let ticks = |nanoseconds: u64| nanoseconds / (1_000_000_000 / TICKS_PER_SECOND);
    if call.args[0] != 0 {
        user::write_words(call.args[0], &[ticks(job::run_time_ns()), 0, 0, 0])?;
    }
    Ok(ticks(clock::monotonic_ns()))
}
