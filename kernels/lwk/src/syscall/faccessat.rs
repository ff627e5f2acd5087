//! faccessat(dirfd, path, mode): whether a path exists and may be used so; everything may be
//! read (and executed), nothing written (EROFS).

use super::{path, Call, Errno, SyscallResult};

const W_OK: u64 = 2;

pub fn check_access(directory: u64, address: u64, mode: u64) -> SyscallResult {
    if mode & !7 != 0 {
        return Err(Errno::EINVAL);
    }
    // A host path (persistent enclave) exists if the host can stat it; the host's rights
    // apply when it is opened.
    if let Some(path) = super::openat::host_path(directory, address) {
        return crate::enclave::files::stat_path(&path?).map(|_| 0).map_err(|error| Errno(error.unsigned_abs()));
    }
    path::lookup(&path::resolve(directory, address)?)?;
    if mode & W_OK != 0 {
        return Err(Errno(30)); // EROFS
    }
    Ok(0)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    check_access(call.args[0], call.args[1], call.args[2])
}
