//! rt_sigpending(set, sigsetsize): the signals pending for the calling thread or the process.

use super::{user, Call, Errno, SyscallResult};
use crate::signal;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [set, set_size, ..] = call.args;
    if set_size > 8 {
        return Err(Errno::EINVAL);
    }
    let pending = signal::pending().to_le_bytes();
    user::write_bytes(set, &pending[..set_size as usize])?;
    Ok(0)
}
