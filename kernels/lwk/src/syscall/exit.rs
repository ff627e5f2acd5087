//! exit(status): ends the calling thread; its process's last thread's exit ends the process
//! with the status's low eight bits (the job's first process: the job).

use super::{Call, SyscallResult};
use crate::sched;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    sched::exit_current(call.args[0] as u8)
}
