//! readlink, readlinkat: only `/proc/self/exe`, which names the job's argv[0] (libc asks for
//! it at start-up); readlinkat ignores its directory (the only link is absolute).

use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::job;

pub fn readlink(path: UserAddr, buffer: UserAddr, size: usize) -> SyscallResult {
    if size == 0 || size > i32::MAX as usize {
        return Err(Errno::EINVAL);
    }
    if user::read_path(path)? != "/proc/self/exe" {
        return Err(Errno::ENOENT);
    }
    let target = job::with_process(|process| process.executable_path.clone());
    let len = target.len().min(size);
    user::write_bytes(buffer, &target.as_bytes()[..len])?;
    Ok(len as u64)
}

pub fn readlinkat(_directory: Fd, path: UserAddr, buffer: UserAddr, size: usize) -> SyscallResult {
    readlink(path, buffer, size)
}
