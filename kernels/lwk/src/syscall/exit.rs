//! exit, exit_group: the status's low eight bits end the thread or the process.

use super::SyscallResult;
use crate::{process, sched};

/// exit(status): ends the calling thread; its process's last thread's exit ends the process
/// with the status's low eight bits (the job's first process: the job).
pub fn exit(status: i32) -> SyscallResult {
    sched::exit_current(status as u8)
}

/// exit_group(status): ends the calling process, all its threads, with the status's low eight
/// bits; for the job's first process that ends the job (the VM's exit status, or the job's
/// status sent to the host).
pub fn exit_group(status: i32) -> SyscallResult {
    process::exit_group(status as u8)
}
