//! exit(status): ends the calling thread; the last thread's exit ends the job with the
//! status's low eight bits as the VM's exit status.

use super::{Call, SyscallResult};
use crate::sched;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    crate::signal::thread_exited(sched::current_tid());
    sched::exit_current(call.args[0] as u8)
}
