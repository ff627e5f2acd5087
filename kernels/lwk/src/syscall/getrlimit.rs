//! getrlimit(resource, rlim): as `prlimit64` on the job itself.

use super::prlimit64::limits_of;
use super::{user, Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [resource, limit, ..] = call.args;
    let (current, maximum) = limits_of(resource)?;
    user::write_words(limit, &[current, maximum])?;
    Ok(0)
}
