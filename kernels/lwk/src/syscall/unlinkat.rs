//! unlinkat(dirfd, path, flags): host paths of a persistent enclave are removed on the host
//! (files only: `AT_REMOVEDIR` there is EPERM, the protocol has no rmdir); the job's own files
//! are read-only (EROFS), missing ones ENOENT.

use super::{openat, path, Call, Errno, SyscallResult};
use crate::enclave::files;

const AT_REMOVEDIR: u64 = 0x200;
const EROFS: Errno = Errno(30);

pub fn remove(directory: u64, address: u64, flags: u64) -> SyscallResult {
    if flags & !AT_REMOVEDIR != 0 {
        return Err(Errno::EINVAL);
    }
    if let Some(host_path) = openat::host_path(directory, address) {
        if flags & AT_REMOVEDIR != 0 {
            return Err(Errno::EPERM);
        }
        return files::to_syscall_result(files::unlink(&host_path?));
    }
    path::lookup(&path::resolve(directory, address)?)?;
    Err(EROFS)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    remove(call.args[0], call.args[1], call.args[2])
}
