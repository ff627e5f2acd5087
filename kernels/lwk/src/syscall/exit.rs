//! The job ends; with a single thread `exit` and `exit_group` are the same. The status's low
//! eight bits become the VM's exit status.

use super::{Call, SyscallResult};
use crate::job;

pub fn call(call: &mut Call) -> SyscallResult {
    job::exit(call.args[0] as u8)
}
