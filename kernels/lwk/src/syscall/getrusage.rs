//! getrusage(who, usage): the job's time since it started as user time (the kernel keeps no
//! per-thread accounting; its own time is not counted), no system time, no page faults (there
//! is no paging); other fields zero.

use super::{user, Call, Errno, SyscallResult};
use crate::job;

const RUSAGE_SELF: i64 = 0;
const RUSAGE_CHILDREN: i64 = -1;
const RUSAGE_THREAD: i64 = 1;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [who, usage, ..] = call.args;
    let run_time = match who as i64 {
        RUSAGE_SELF | RUSAGE_THREAD => job::run_time_ns(),
        RUSAGE_CHILDREN => 0,
        _ => return Err(Errno::EINVAL),
    };
    let mut fields = [0u64; 18]; // two timevals, then fourteen longs
    fields[0] = run_time / 1_000_000_000;
    fields[1] = run_time % 1_000_000_000 / 1000;
    user::write_words(usage, &fields)?;
    Ok(0)
}
