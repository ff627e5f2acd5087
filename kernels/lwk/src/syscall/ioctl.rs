//! ioctl(fd, request, arg): no descriptor is a terminal or a device, so every request fails
//! with ENOTTY, as on a pipe or a file (libc then chooses full buffering for the console).

use super::{Call, Errno, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    match job::with_process(|process| process.descriptors.get(call.args[0]).is_some()) {
        true => Err(Errno::ENOTTY),
        false => Err(Errno::EBADF),
    }
}
