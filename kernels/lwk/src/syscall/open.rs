//! open(path, flags, mode): as `openat` (no file system yet: ENOENT).

use super::{user, Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    user::read_path(call.args[0])?;
    Err(Errno::ENOENT)
}
