//! openat(dirfd, path, flags, mode): there is no file system yet, so every path is absent
//! (ENOENT), which programs that probe /proc or /sys handle as on a minimal Linux. A bad
//! path pointer is EFAULT.

use super::{user, Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    user::read_path(call.args[1])?;
    Err(Errno::ENOENT)
}
