//! nanosleep(req, rem): the thread waits (other threads of its CPU run meanwhile); never
//! interrupted, so `rem` is left alone.

use super::clock_nanosleep::read_duration;
use super::{Call, SyscallResult};
use crate::{clock, sched};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let duration = read_duration(call.args[0])?;
    sched::sleep_until(clock::monotonic_ns().saturating_add(duration));
    Ok(0)
}
