//! time(tloc): seconds since the epoch.

use super::{user, Call, SyscallResult};
use crate::clock;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let seconds = clock::realtime_ns() / 1_000_000_000;
    if call.args[0] != 0 {
        user::write_words(call.args[0], &[seconds])?;
    }
    Ok(seconds)
}
