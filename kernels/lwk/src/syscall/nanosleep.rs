//! nanosleep(req, rem): the thread waits (other threads of its CPU run meanwhile). A signal
//! it takes ends the sleep: the remaining time goes to `rem` (if given) and the call returns
//! EINTR once a handler runs (never restarted after one, SA_RESTART or not), as on Linux.

use super::clock_nanosleep::{read_duration, sleep_relative};
use super::{Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let duration = read_duration(call.args[0])?;
    sleep_relative(duration, call.args[1])
}
