//! sched_setaffinity(tid, len, mask): moves the thread to the lowest CPU of `mask` that is
//! online, unless it already runs on a CPU of the mask. A mask without an online CPU is
//! EINVAL; another process's tid is ESRCH.

use super::{user, Call, Errno, SyscallResult};
use crate::sched::{self, AffinityError};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [tid, len, mask, ..] = call.args;
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    // CPUs beyond the first 64 do not exist here; only the first word matters.
    let bytes = user::read_bytes(mask, (len as usize).min(8))?;
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(&bytes);
    let tid = if tid == 0 { sched::current_tid() } else { tid };
    sched::set_affinity(tid, u64::from_le_bytes(word)).map(|_| 0).map_err(|error| match error {
        AffinityError::NoSuchThread => Errno(3), // ESRCH
        AffinityError::NoOnlineCpu => Errno::EINVAL,
    })
}
