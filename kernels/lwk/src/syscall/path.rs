//! Resolving the paths system calls name: relative to the working directory (`/`) or to a
//! directory descriptor, then looked up in the job's file system.

use super::{user, Errno, Fd, UserAddr};
use crate::fs::{self, Node};
use crate::job::{self, descriptors::Descriptor};
use alloc::string::String;

/// AT_FDCWD: relative to the working directory (the `*at` calls' directory argument).
pub const AT_FDCWD: Fd = Fd(-100);
/// The job runs in the root of its file system.
const WORKING_DIRECTORY: &str = "/";

/// The absolute path named by `address` relative to `directory_descriptor`.
pub fn resolve(directory_descriptor: Fd, address: UserAddr) -> Result<String, Errno> {
    resolve_text(directory_descriptor, &user::read_path(address)?)
}

/// [`resolve`] of a path already read from the job.
pub fn resolve_text(directory_descriptor: Fd, path: &str) -> Result<String, Errno> {
    let base = if path.starts_with('/') || directory_descriptor == AT_FDCWD {
        String::from(WORKING_DIRECTORY)
    } else {
        job::with_process(|process| match process.descriptors.get(directory_descriptor).as_deref() {
            Some(Descriptor::Directory { path, .. }) => Ok(path.clone()),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::EBADF),
        })?
    };
    fs::normalize(&base, path).ok_or(Errno::ENOENT)
}

pub fn lookup(path: &str) -> Result<Node, Errno> {
    fs::lookup(path).ok_or(Errno::ENOENT)
}
