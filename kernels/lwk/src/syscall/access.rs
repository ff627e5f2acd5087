//! access(path, mode): as `faccessat` relative to the working directory.

use super::faccessat::check_access;
use super::{Call, SyscallResult};

const AT_FDCWD: u64 = -100i64 as u64;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    check_access(AT_FDCWD, call.args[0], call.args[1])
}
