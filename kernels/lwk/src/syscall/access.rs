//! access, faccessat: whether a path exists and may be used so; everything may be read (and
//! executed), nothing written (EROFS). Mode: R_OK, W_OK, X_OK (or F_OK); other bits EINVAL.

use super::path::{self, AT_FDCWD};
use super::{open, Errno, Fd, SyscallResult, UserAddr};
use crate::linux::uapi;

const W_OK: i32 = uapi::W_OK as i32;

pub fn access(path: UserAddr, mode: i32) -> SyscallResult {
    faccessat(AT_FDCWD, path, mode)
}

pub fn faccessat(directory: Fd, address: UserAddr, mode: i32) -> SyscallResult {
    if mode & !7 != 0 {
        return Err(Errno::EINVAL);
    }
    // A host path (persistent enclave) exists if the host can stat it; the host's rights
    // apply when it is opened.
    if let Some(path) = open::host_path(directory, address) {
        return crate::enclave::files::stat_path(&path?).map(|_| 0).map_err(|error| Errno(error.unsigned_abs()));
    }
    path::lookup(&path::resolve(directory, address)?)?;
    if mode & W_OK != 0 {
        return Err(Errno::EROFS);
    }
    Ok(0)
}
