//! exit_group(status): ends the job, all threads; the status's low eight bits become the VM's
//! exit status.

use super::{Call, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    job::exit(call.args[0] as u8)
}
