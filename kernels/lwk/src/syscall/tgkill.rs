//! tgkill(tgid, tid, sig): a signal to one of the job's threads (the job is the only group).

use super::kill::send_to_thread;
use super::{Call, Errno, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [group, tid, signal, ..] = call.args;
    if (group as i64) <= 0 {
        return Err(Errno::EINVAL);
    }
    if group != job::PID {
        return Err(Errno(3)); // ESRCH
    }
    send_to_thread(tid, signal)
}
