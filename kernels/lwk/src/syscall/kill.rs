//! kill(pid, sig) to the job itself: the default action of the signal (no handler is ever
//! run: signal delivery does not exist yet). Terminating signals end the job with status
//! 128 + sig; the ones Linux ignores by default are ignored.

use super::{Call, Errno, SyscallResult};
use crate::job;

const SIGCHLD: u64 = 17;
const SIGCONT: u64 = 18;
const SIGURG: u64 = 23;
const SIGWINCH: u64 = 28;

/// Sends `signal` to the job (`0` only checks that the job exists).
pub fn signal_job(target: u64, signal: u64) -> SyscallResult {
    if target != job::PID {
        return Err(Errno(3)); // ESRCH
    }
    match signal {
        0 | SIGCHLD | SIGCONT | SIGURG | SIGWINCH => Ok(0),
        1..=64 => job::exit_by_signal(signal as u8),
        _ => Err(Errno::EINVAL),
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let pid = call.args[0] as i64;
    // 0 and -1 address the caller's group, which is the job.
    let target = if pid == 0 || pid == -1 { job::PID } else { pid as u64 };
    signal_job(target, call.args[1])
}
