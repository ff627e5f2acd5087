//! mkdir, mkdirat: host paths of a persistent enclave are created on the host; in the job's
//! own read-only file system an existing path is EEXIST, a new one EROFS.

use super::path::{self, AT_FDCWD};
use super::{open, Errno, Fd, SyscallResult, UserAddr};
use crate::enclave::files;

pub fn mkdir(path: UserAddr, mode: u32) -> SyscallResult {
    mkdirat(AT_FDCWD, path, mode)
}

pub fn mkdirat(directory: Fd, address: UserAddr, mode: u32) -> SyscallResult {
    if let Some(host_path) = open::host_path(directory, address) {
        return files::to_syscall_result(files::make_directory(&host_path?, mode));
    }
    match path::lookup(&path::resolve(directory, address)?) {
        Ok(_) => Err(Errno::EEXIST),
        Err(_) => Err(Errno::EROFS),
    }
}
