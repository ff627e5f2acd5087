//! wait4, waitid: waiting for a child to end, and reaping it. ECHILD with no such child.
//! Options: WNOHANG (nothing when none has ended yet); WUNTRACED and WCONTINUED are accepted
//! (no child ever stops); __WALL and __WCLONE are accepted by wait4 (every child is a
//! process here); waitid requires WEXITED and honours WNOWAIT (leave the child waitable).
//! Other options are EINVAL. The rusage is zeros.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::linux::{rusage, siginfo};
use crate::linux_consts;
use crate::process::{self, Selector, Waited, SIGCHLD};
use core::mem::size_of;

linux_consts!(u32: WNOHANG, WUNTRACED, WEXITED, WCONTINUED, WNOWAIT);
/// __WALL and __WCLONE.
const WALL_WCLONE: u32 = 0x4000_0000 | 0x8000_0000;
linux_consts!(u32: P_ALL, P_PID, P_PGID; i32: CLD_EXITED, CLD_KILLED);
const RUSAGE_SIZE: usize = size_of::<rusage>();

fn selector(pid: i32) -> Selector {
    match pid {
        -1 => Selector::Any,
        0 => Selector::Group(0),
        pid if pid < 0 => Selector::Group(pid.unsigned_abs() as u64),
        pid => Selector::Pid(pid as u64),
    }
}

/// wait4(pid, status, options, rusage): waits for a child to end (pid > 0: that child, -1:
/// any, 0: one of the caller's group, < -1: one of group -pid) and reaps it; returns its pid
/// (0 with WNOHANG when none has ended). The status is Linux's (code << 8, or the signal).
pub fn wait4(pid: i32, status: UserAddr, options: u32, rusage: UserAddr) -> SyscallResult {
    if options & !(WNOHANG | WUNTRACED | WCONTINUED | WALL_WCLONE) != 0 {
        return Err(Errno::EINVAL);
    }
    match process::wait_for_child(selector(pid), options & WNOHANG != 0, false)? {
        Waited::NotYet => Ok(0),
        Waited::Ended(child, wait_status) => {
            if let Some(status) = status.non_null() {
                user::write_bytes(status, &wait_status.to_le_bytes())?;
            }
            if let Some(rusage) = rusage.non_null() {
                user::write_bytes(rusage, &[0; RUSAGE_SIZE])?;
            }
            Ok(child)
        }
    }
}

/// waitid(idtype, id, info, options, rusage): P_ALL, P_PID, P_PGID. The siginfo says
/// SIGCHLD, CLD_EXITED or CLD_KILLED, the child's pid and status; with WNOHANG and no ended
/// child it is cleared (si_pid 0).
pub fn waitid(id_type: u32, id: i32, info: UserAddr, options: u32, rusage: UserAddr) -> SyscallResult {
    if options & WEXITED == 0 || options & !(WEXITED | WNOHANG | WNOWAIT | WUNTRACED | WCONTINUED) != 0 {
        return Err(Errno::EINVAL);
    }
    let selector = match id_type {
        P_ALL => Selector::Any,
        P_PID if id > 0 => Selector::Pid(id as u64),
        P_PGID => Selector::Group(id as u32 as u64),
        _ => return Err(Errno::EINVAL),
    };
    let mut info_bytes = [0u8; siginfo::SIZE];
    if let Waited::Ended(child, status) = process::wait_for_child(selector, options & WNOHANG != 0, options & WNOWAIT != 0)? {
        let (code, value) = match status & 0x7f {
            0 => (CLD_EXITED, (status >> 8) & 0xff),
            signal => (CLD_KILLED, signal),
        };
        info_bytes[siginfo::SIGNO..][..4].copy_from_slice(&(SIGCHLD as i32).to_le_bytes());
        info_bytes[siginfo::CODE..][..4].copy_from_slice(&code.to_le_bytes());
        info_bytes[siginfo::PID..][..4].copy_from_slice(&(child as u32).to_le_bytes());
        info_bytes[siginfo::STATUS..][..4].copy_from_slice(&value.to_le_bytes());
    }
    if let Some(info) = info.non_null() {
        user::write_bytes(info, &info_bytes)?;
    }
    if let Some(rusage) = rusage.non_null() {
        user::write_bytes(rusage, &[0; RUSAGE_SIZE])?;
    }
    Ok(0)
}
