//! read(fd, buf, count): standard input is empty (the job has no terminal); other
//! descriptors do not exist yet.

use super::{Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    match call.args[0] {
        0 => Ok(0),
        _ => Err(Errno::EBADF),
    }
}
