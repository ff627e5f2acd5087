//! ioctl(fd, request, arg): the console is not a terminal, so terminal requests fail with
//! ENOTTY as they do on a pipe (libc then chooses full buffering).

use super::{Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    match call.args[0] {
        0..=2 => Err(Errno::ENOTTY),
        _ => Err(Errno::EBADF),
    }
}
