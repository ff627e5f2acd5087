//! mkdirat(dirfd, path, mode): host paths of a persistent enclave are created on the host;
//! in the job's own read-only file system an existing path is EEXIST, a new one EROFS.

use super::{openat, path, Call, Errno, SyscallResult};
use crate::enclave::files;

const EEXIST: Errno = Errno(17);
const EROFS: Errno = Errno(30);

pub fn make(directory: u64, address: u64, mode: u64) -> SyscallResult {
    if let Some(host_path) = openat::host_path(directory, address) {
        return files::to_syscall_result(files::make_directory(&host_path?, mode as u32));
    }
    match path::lookup(&path::resolve(directory, address)?) {
        Ok(_) => Err(EEXIST),
        Err(_) => Err(EROFS),
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    make(call.args[0], call.args[1], call.args[2])
}
