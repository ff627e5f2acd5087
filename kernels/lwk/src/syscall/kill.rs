//! kill(pid, sig): to process `pid`, the caller's process group (0), every process but the
//! job's first (-1), or group -pid; `crate::signal` delivers it to a thread that does not
//! block it, running its handler or its default action. Signal 0 only checks that a target
//! exists; none is ESRCH.

use super::{Call, Errno, SyscallResult};
use crate::signal::{self, SI_TKILL, SI_USER};
use crate::{process, sched};

const ESRCH: Errno = Errno(3);

/// Sends `signal` to the calling process (`thread` None) or to one of its threads.
pub fn send(thread: Option<u64>, signal: u64, code: i32) -> SyscallResult {
    match signal {
        0 => Ok(0),
        1..=64 => signal::send(thread, signal as u8, code).map(|()| 0).map_err(|_| ESRCH),
        _ => Err(Errno::EINVAL),
    }
}

/// `tkill` and `tgkill`: to thread `tid` of the calling process.
pub fn send_to_thread(tid: u64, signal: u64) -> SyscallResult {
    if !(1..=64).contains(&signal) && signal != 0 {
        return Err(Errno::EINVAL);
    }
    if (tid as i64) <= 0 {
        return Err(Errno::EINVAL);
    }
    send(Some(tid), signal, SI_TKILL)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [pid, signal, ..] = call.args;
    if signal > 64 {
        return Err(Errno::EINVAL);
    }
    let targets = process::kill_targets(pid as i32 as i64);
    if targets.is_empty() {
        return Err(ESRCH);
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
