//! tgkill(tgid, tid, sig): a signal to one of the calling process's threads.

use super::kill::send_to_thread;
use super::{Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [group, tid, signal, ..] = call.args;
    if (group as i64) <= 0 {
        return Err(Errno::EINVAL);
    }
    if group != crate::sched::current_pid() {
        return Err(Errno(3)); // ESRCH
    }
    send_to_thread(tid, signal)
}
