//! open(path, flags, mode): as `openat` relative to the working directory.

use super::{openat, Call, SyscallResult};

const AT_FDCWD: u64 = -100i64 as u64;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    if let Some(result) = openat::open_on_host(AT_FDCWD, call.args[0], call.args[1], call.args[2]) {
        return result;
    }
    openat::open(AT_FDCWD, call.args[0], call.args[1])
}
