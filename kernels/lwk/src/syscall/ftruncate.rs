//! ftruncate(fd, length): host files of a persistent enclave; nothing else is open for
//! writing (EINVAL), unknown descriptors EBADF.

use super::{Errno, Fd, SyscallResult};
use crate::enclave::files;
use crate::job;

pub fn ftruncate(descriptor: Fd, length: i64) -> SyscallResult {
    if length < 0 {
        return Err(Errno::EINVAL);
    }
    if let Some(handle) = files::remote_handle(descriptor) {
        return files::to_syscall_result(files::truncate(handle, length as u64));
    }
    match job::with_process(|process| process.descriptors.get(descriptor).is_some()) {
        true => Err(Errno::EINVAL),
        false => Err(Errno::EBADF),
    }
}
