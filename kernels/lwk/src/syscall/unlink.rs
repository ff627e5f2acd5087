//! unlink, unlinkat: host paths of a persistent enclave are removed on the host (files only:
//! AT_REMOVEDIR there is EPERM, the protocol has no rmdir); the job's own files are read-only
//! (EROFS), missing ones ENOENT. Flags: AT_REMOVEDIR; others EINVAL, as on Linux.

use super::path::{self, AT_FDCWD};
use super::{open, Errno, Fd, SyscallResult, UserAddr};
use crate::enclave::files;
use crate::linux::uapi;

const AT_REMOVEDIR: i32 = uapi::AT_REMOVEDIR as i32;

pub fn unlink(path: UserAddr) -> SyscallResult {
    unlinkat(AT_FDCWD, path, 0)
}

pub fn unlinkat(directory: Fd, address: UserAddr, flags: i32) -> SyscallResult {
    if flags & !AT_REMOVEDIR != 0 {
        return Err(Errno::EINVAL);
    }
    if let Some(host_path) = open::host_path(directory, address) {
        if flags & AT_REMOVEDIR != 0 {
            return Err(Errno::EPERM);
        }
        return files::to_syscall_result(files::unlink(&host_path?));
    }
    path::lookup(&path::resolve(directory, address)?)?;
    Err(Errno::EROFS)
}
