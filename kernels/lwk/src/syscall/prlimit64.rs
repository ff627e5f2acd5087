//! prlimit64(pid, resource, new, old): reports the limits the job really has (its stack size,
//! its heap); new limits are accepted but change nothing, since memory is fixed at load.

use super::{user, Call, Errno, SyscallResult};
use crate::job;

const RLIMIT_DATA: u64 = 2;
const RLIMIT_STACK: u64 = 3;
const RLIMIT_NOFILE: u64 = 7;
const RLIMIT_AS: u64 = 9;
const RLIM_INFINITY: u64 = u64::MAX;
const RLIMIT_COUNT: u64 = 16;

pub fn limits_of(resource: u64) -> Result<(u64, u64), Errno> {
    let (stack, heap) = job::with_process(|process| {
        let memory = &process.memory;
        (memory.stack.end - memory.stack.start, memory.heap.end - memory.heap.start)
    });
    match resource {
        RLIMIT_STACK => Ok((stack, stack)),
        RLIMIT_DATA | RLIMIT_AS => Ok((heap, heap)),
        RLIMIT_NOFILE => Ok((1024, 1024)),
        0..RLIMIT_COUNT => Ok((RLIM_INFINITY, RLIM_INFINITY)),
        _ => Err(Errno::EINVAL),
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [pid, resource, _new, old, ..] = call.args;
    if pid != 0 && pid != crate::sched::current_pid() {
        return Err(Errno(3)); // ESRCH
    }
    let (current, maximum) = limits_of(resource)?;
    if old != 0 {
        user::write_words(old, &[current, maximum])?;
    }
    Ok(0)
}
