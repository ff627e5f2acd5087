//! mkdir(path, mode): as `mkdirat` relative to the working directory.

use super::{mkdirat, Call, SyscallResult};

const AT_FDCWD: u64 = -100i64 as u64;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    mkdirat::make(AT_FDCWD, call.args[0], call.args[1])
}
