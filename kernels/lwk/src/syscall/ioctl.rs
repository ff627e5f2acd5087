//! ioctl(fd, request, arg): `/dev/xpmem` takes XPMEM's commands (`crate::xpmem`); no other
//! descriptor is a terminal or a device, so every other request fails with ENOTTY, as on a
//! pipe or a file (libc then chooses full buffering for the console).

use super::{Call, Errno, SyscallResult};
use crate::job;
use crate::job::descriptors::Descriptor;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    if let Some(result) = crate::xpmem::parking(call.args[0], call.args[1], call.args[2]) {
        return result;
    }
    let is_xpmem = job::with_process(|process| process.descriptors.get(call.args[0]).map(|open| matches!(*open, Descriptor::Xpmem)));
    match is_xpmem {
        Some(true) => crate::xpmem::ioctl(call.args[1], call.args[2]),
        Some(false) => Err(Errno::ENOTTY),
        None => Err(Errno::EBADF),
    }
}
