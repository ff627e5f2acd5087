//! Who the caller is: process, thread, parent, group and session ids, and the user and group
//! ids. The job runs as root (uid and gid 0) inside its enclave: there is no one else to
//! protect.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::{process, sched};

pub fn getuid() -> SyscallResult {
    Ok(0)
}

pub fn geteuid() -> SyscallResult {
    Ok(0)
}

pub fn getgid() -> SyscallResult {
    Ok(0)
}

pub fn getegid() -> SyscallResult {
    Ok(0)
}

/// getresuid(ruid, euid, suid) and getresgid(rgid, egid, sgid): root's ids, written one at a
/// time in that order as Linux does (a bad second pointer leaves the first written: EFAULT).
pub fn getresuid(real: UserAddr, effective: UserAddr, saved: UserAddr) -> SyscallResult {
    for id in [real, effective, saved] {
        user::write_bytes(id, &0u32.to_le_bytes())?;
    }
    Ok(0)
}

pub fn getresgid(real: UserAddr, effective: UserAddr, saved: UserAddr) -> SyscallResult {
    getresuid(real, effective, saved)
}

pub fn getpid() -> SyscallResult {
    Ok(sched::current_pid())
}

pub fn gettid() -> SyscallResult {
    Ok(sched::current_tid())
}

pub fn getppid() -> SyscallResult {
    Ok(process::parent_of(sched::current_pid()))
}

/// getpgrp(): the caller's process group.
pub fn getpgrp() -> SyscallResult {
    process::group_of(0).map(|(group, _)| group)
}

/// getpgid(pid): the process group of `pid` (0: the caller); ESRCH if there is no such
/// process.
pub fn getpgid(pid: i32) -> SyscallResult {
    process::group_of(pid as u32 as u64).map(|(group, _)| group)
}

/// getsid(pid): the session of `pid` (0: the caller); ESRCH if there is no such process.
pub fn getsid(pid: i32) -> SyscallResult {
    process::group_of(pid as u32 as u64).map(|(_, session)| session)
}

/// setpgid(pid, pgid): the caller (pid 0) or one of its children joins group `pgid` (0: its
/// own pid) in the caller's session. ESRCH for a process that is neither, EPERM for a group
/// of another session or a session leader.
pub fn setpgid(pid: i32, group: i32) -> SyscallResult {
    if pid < 0 || group < 0 {
        return Err(Errno::EINVAL);
    }
    process::set_group(pid as u64, group as u64).map(|()| 0)
}

/// setsid(): the caller leads a new session and group; EPERM if it leads a group already.
pub fn setsid() -> SyscallResult {
    process::new_session()
}
