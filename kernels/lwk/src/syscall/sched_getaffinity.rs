//! sched_getaffinity(pid, len, mask): the CPUs of the job's enclave (every thread may be
//! placed on any of them). Returns the bytes written, as the raw system call does.

use super::{user, Call, Errno, SyscallResult};
use crate::sched;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [_pid, len, mask, ..] = call.args;
    if len < 8 || len % 8 != 0 {
        return Err(Errno::EINVAL);
    }
    user::write_words(mask, &[sched::online_cpu_mask()])?;
    Ok(8)
}
