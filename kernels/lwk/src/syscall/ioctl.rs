//! ioctl(fd, request, arg): `/dev/xpmem` takes XPMEM's commands (`crate::xpmem`), whose
//! argument is always a pointer to the command's structure; no other descriptor is a terminal
//! or a device, so every other request fails with ENOTTY, as on a pipe or a file (libc then
//! chooses full buffering for the console).

use super::{Errno, Fd, SyscallResult, UserAddr};
use crate::job;
use crate::job::descriptors::Descriptor;

pub fn ioctl(fd: Fd, request: u32, argument: UserAddr) -> SyscallResult {
    if let Some(result) = crate::xpmem::parking(fd, request, argument) {
        return result;
    }
    let is_xpmem = job::with_process(|process| process.descriptors.get(fd).map(|open| matches!(*open, Descriptor::Xpmem)));
    match is_xpmem {
        Some(true) => crate::xpmem::ioctl(request, argument),
        Some(false) => Err(Errno::ENOTTY),
        None => Err(Errno::EBADF),
    }
}
