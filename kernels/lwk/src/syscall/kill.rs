//! kill(pid, sig) to the job itself (pid 1, 0 or -1): `crate::signal` delivers it to a thread
//! that does not block it, running its handler or its default action (128 + sig for the
//! terminating ones). 0 only checks that the job exists; other pids are ESRCH.

use super::{Call, Errno, SyscallResult};
use crate::job;
use crate::signal::{self, SI_TKILL, SI_USER};

const ESRCH: Errno = Errno(3);

/// Sends `signal` to the whole job (`thread` None) or to one of its threads.
pub fn send(thread: Option<u64>, signal: u64, code: i32) -> SyscallResult {
    match signal {
        0 => Ok(0),
        1..=64 => signal::send(thread, signal as u8, code).map(|()| 0).map_err(|_| ESRCH),
        _ => Err(Errno::EINVAL),
    }
}

/// `tkill` and `tgkill`: to thread `tid` of the job.
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
    let pid = call.args[0] as i64;
    // 0 and -1 address the caller's group, which is the job.
    if pid != 0 && pid != -1 && pid as u64 != job::PID {
        return Err(ESRCH);
    }
    send(None, call.args[1], SI_USER)
}
