//! kill, tkill, tgkill: signals to processes and threads of the job; `crate::signal`
//! delivers them to a thread that does not block them, running the handler or the default
//! action. Signal 0 only checks that a target exists; none is ESRCH; signals outside 0..=64
//! are EINVAL.

use super::{Errno, SyscallResult};
use crate::signal::{self, SI_TKILL, SI_USER};
use crate::{process, sched};

/// Sends `signal` to the calling process (`thread` None) or to one of its threads.
fn send(thread: Option<u64>, signal: i32, code: i32) -> SyscallResult {
    match signal {
        0 => Ok(0),
        1..=64 => signal::send(thread, signal as u8, code).map(|()| 0).map_err(|_| Errno::ESRCH),
        _ => Err(Errno::EINVAL),
    }
}

/// kill(pid, sig): to process `pid`, the caller's process group (0), every process but the
/// job's first (-1), or group -pid.
pub fn kill(pid: i32, signal: i32) -> SyscallResult {
    if !(0..=64).contains(&signal) {
        return Err(Errno::EINVAL);
    }
    let targets = process::kill_targets(pid as i64);
    if targets.is_empty() {
        return Err(Errno::ESRCH);
    }
    let caller = sched::current_pid();
    // The caller last: a terminating signal to itself does not return.
    for &target in targets.iter().filter(|&&target| target != caller) {
        if signal != 0 {
            signal::send_to_process(target, signal as u8);
        }
    }
    if targets.contains(&caller) {
        send(None, signal, SI_USER)?;
    }
    Ok(0)
}

/// tkill(tid, sig): a signal to one of the job's threads.
pub fn tkill(tid: i32, signal: i32) -> SyscallResult {
    if !(0..=64).contains(&signal) || tid <= 0 {
        return Err(Errno::EINVAL);
    }
    send(Some(tid as u64), signal, SI_TKILL)
}

/// tgkill(tgid, tid, sig): a signal to one of the calling process's threads.
pub fn tgkill(group: i32, tid: i32, signal: i32) -> SyscallResult {
    if group <= 0 {
        return Err(Errno::EINVAL);
    }
    if group as u64 != sched::current_pid() {
        return Err(Errno::ESRCH);
    }
    tkill(tid, signal)
}
