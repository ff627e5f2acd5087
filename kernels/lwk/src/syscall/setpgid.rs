//! setpgid(pid, pgid): the caller (pid 0) or one of its children joins group `pgid` (0: its
//! own pid) in the caller's session. ESRCH for a process that is neither, EPERM for a group
//! of another session or a session leader.

use super::{Call, SyscallResult};
use crate::process;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [pid, group, ..] = call.args;
    if (pid as i32) < 0 || (group as i32) < 0 {
        return Err(super::Errno::EINVAL);
    }
    process::set_group(pid as u32 as u64, group as u32 as u64).map(|()| 0)
}
