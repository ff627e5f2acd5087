//! lseek(fd, offset, whence): the console cannot seek.

use super::{Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    match call.args[0] {
        0..=2 => Err(Errno::ESPIPE),
        _ => Err(Errno::EBADF),
    }
}
