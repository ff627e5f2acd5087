//! getpid(): the calling thread's process (the job's first process is 1).

use super::{Call, SyscallResult};
use crate::sched;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    Ok(sched::current_pid())
}
