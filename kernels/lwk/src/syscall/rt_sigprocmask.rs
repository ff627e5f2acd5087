//! rt_sigprocmask(how, set, oldset, sigsetsize): the calling thread's mask. A signal that
//! becomes unblocked while pending is delivered as the call returns.

use super::{user, Call, Errno, SyscallResult};
use crate::signal;

const SIG_BLOCK: u64 = 0;
const SIG_UNBLOCK: u64 = 1;
const SIG_SETMASK: u64 = 2;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [how, set, old_set, set_size, ..] = call.args;
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let old = if set != 0 {
        let [requested] = user::read_words::<1>(set)?;
        let change: fn(u64, u64) -> u64 = match how {
            SIG_BLOCK => |old, requested| old | requested,
            SIG_UNBLOCK => |old, requested| old & !requested,
            SIG_SETMASK => |_, requested| requested,
            _ => return Err(Errno::EINVAL),
        };
        signal::change_mask(|old| change(old, requested))
    } else {
        signal::change_mask(|old| old)
    };
    if old_set != 0 {
        user::write_words(old_set, &[old])?;
    }
    Ok(0)
}
