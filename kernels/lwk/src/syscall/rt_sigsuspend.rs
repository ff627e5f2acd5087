//! rt_sigsuspend(mask, sigsetsize): waits with `mask` as the thread's mask until a signal it
//! then takes arrives; returns EINTR once the handler has run, with the old mask back.

use super::{user, Call, Errno, SyscallResult};
use crate::signal;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [mask, set_size, ..] = call.args;
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let [mask] = user::read_words::<1>(mask)?;
    Err(signal::suspend(mask).errno())
}
