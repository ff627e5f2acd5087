//! wait4(pid, status, options, rusage): waits for a child to end (pid > 0: that child, -1:
//! any, 0: one of the caller's group, < -1: one of group -pid) and reaps it. Options: WNOHANG
//! (0 when none has ended yet); WUNTRACED and WCONTINUED are accepted (no child ever stops).
//! The status is Linux's (code << 8, or the signal); the rusage is zeros. ECHILD with no such
//! child.

use super::{user, Call, Errno, SyscallResult};
use crate::process::{self, Selector, Waited};

pub const WNOHANG: u64 = 1;
const WUNTRACED: u64 = 2;
const WCONTINUED: u64 = 8;
/// __WALL and __WCLONE: every child is a process here.
const WALL_WCLONE: u64 = 0x4000_0000 | 0x8000_0000;
const RUSAGE_SIZE: usize = 144;

pub fn selector(pid: i64) -> Selector {
    match pid {
        -1 => Selector::Any,
        0 => Selector::Group(0),
        pid if pid < 0 => Selector::Group(pid.unsigned_abs()),
        pid => Selector::Pid(pid as u64),
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [pid, status, options, rusage, ..] = call.args;
    if options & !(WNOHANG | WUNTRACED | WCONTINUED | WALL_WCLONE) != 0 {
        return Err(Errno::EINVAL);
    }
    match process::wait_for_child(selector(pid as i32 as i64), options & WNOHANG != 0, false)? {
        Waited::NotYet => Ok(0),
        Waited::Ended(child, wait_status) => {
            if status != 0 {
                user::write_bytes(status, &wait_status.to_le_bytes())?;
            }
            if rusage != 0 {
                user::write_bytes(rusage, &[0; RUSAGE_SIZE])?;
            }
            Ok(child)
        }
    }
}
