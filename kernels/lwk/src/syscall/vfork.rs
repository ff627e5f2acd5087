//! vfork(): `clone(CLONE_VM | CLONE_VFORK | SIGCHLD)`: the child gets a copy of the
//! caller's memory and the caller waits until the child executes a new image or ends.

use super::{clone, Call, Errno, SyscallResult};

const CLONE_VM_VFORK_SIGCHLD: u64 = 0x100 | 0x4000 | 17;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let frame = call.frame.as_deref().ok_or(Errno::ENOSYS)?;
    clone::new_process(frame, CLONE_VM_VFORK_SIGCHLD, 0, 0, 0, 0)
}
