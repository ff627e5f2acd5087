//! unlink(path): as `unlinkat` relative to the working directory.

use super::{unlinkat, Call, SyscallResult};

const AT_FDCWD: u64 = -100i64 as u64;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    unlinkat::remove(AT_FDCWD, call.args[0], 0)
}
