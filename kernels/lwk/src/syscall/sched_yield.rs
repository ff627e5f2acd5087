//! sched_yield(): the next runnable thread of the job runs, if there is one.

use super::{Call, SyscallResult};
use crate::sched;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    sched::yield_now();
    Ok(0)
}
