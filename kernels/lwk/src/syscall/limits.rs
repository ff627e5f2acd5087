//! getrlimit, prlimit64: the limits the job really has (its stack size, its heap); new limits
//! are accepted but change nothing, since memory is fixed at load.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::linux::rlimit;
use crate::linux_consts;
use crate::{job, linux_struct, sched};

linux_consts!(u32: RLIMIT_DATA, RLIMIT_STACK, RLIMIT_NOFILE, RLIMIT_AS);
const RLIM_INFINITY: u64 = u64::MAX;
const RLIMIT_COUNT: u32 = 16;

/// The (soft, hard) limits of `resource`.
fn limits_of(resource: u32) -> Result<(u64, u64), Errno> {
    let (stack, heap) = job::with_process(|process| {
        let memory = &process.memory;
        (memory.stack.end - memory.stack.start, memory.heap.end - memory.heap.start)
    });
    match resource {
        RLIMIT_STACK => Ok((stack, stack)),
        RLIMIT_DATA | RLIMIT_AS => Ok((heap, heap)),
        RLIMIT_NOFILE => Ok((1024, 1024)),
        0..RLIMIT_COUNT => Ok((RLIM_INFINITY, RLIM_INFINITY)),
        _ => Err(Errno::EINVAL),
    }
}

/// getrlimit(resource, rlim): as `prlimit64` on the job itself.
pub fn getrlimit(resource: u32, limit: UserAddr) -> SyscallResult {
    let (current, maximum) = limits_of(resource)?;
    user::write_bytes(limit, &linux_struct!(rlimit { rlim_cur: current, rlim_max: maximum }))?;
    Ok(0)
}

/// prlimit64(pid, resource, new, old): the caller only (pid 0 or its own), else ESRCH.
pub fn prlimit64(pid: i32, resource: u32, _new_limit: UserAddr, old_limit: UserAddr) -> SyscallResult {
    if pid != 0 && pid as u64 != sched::current_pid() {
        return Err(Errno::ESRCH);
    }
    let (current, maximum) = limits_of(resource)?;
    if let Some(old_limit) = old_limit.non_null() {
        user::write_bytes(old_limit, &linux_struct!(rlimit { rlim_cur: current, rlim_max: maximum }))?;
    }
    Ok(0)
}
