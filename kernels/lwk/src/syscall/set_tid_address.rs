//! set_tid_address(tidptr): remembered for thread exit; returns the caller's thread id.

use super::{Call, SyscallResult};
use crate::job;

pub fn call(call: &mut Call) -> SyscallResult {
    Ok(job::with_process(|process| {
        process.clear_child_tid = call.args[0];
        job::PID
    }))
}
