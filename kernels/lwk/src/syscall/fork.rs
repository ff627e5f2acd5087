//! fork(): `clone(SIGCHLD)`, a new process with a copy of the caller's memory (musl calls it).

use super::{clone, Call, Errno, SyscallResult};

const SIGCHLD: u64 = 17;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let frame = call.frame.as_deref().ok_or(Errno::ENOSYS)?;
    clone::new_process(frame, SIGCHLD, 0, 0, 0, 0)
}
