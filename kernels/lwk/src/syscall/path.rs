//! Resolving the paths system calls name: relative to the working directory (`/`) or to a
//! directory descriptor, then looked up in the job's file system.

use super::{user, Errno};
use crate::fs::{self, Node};
use crate::job::{self, descriptors::Descriptor};
use alloc::string::String;

/// AT_FDCWD: relative to the working directory. Descriptors are C `int`s: only the low 32
/// bits of the register count.
const AT_FDCWD: i32 = -100;
/// The job runs in the root of its file system.
const WORKING_DIRECTORY: &str = "/";

/// The absolute path named by `address` relative to `directory_descriptor`.
pub fn resolve(directory_descriptor: u64, address: u64) -> Result<String, Errno> {
    let path = user::read_path(address)?;
    let base = if path.starts_with('/') || directory_descriptor as u32 as i32 == AT_FDCWD {
        String::from(WORKING_DIRECTORY)
    } else {
        job::with_process(|process| match process.descriptors.get(directory_descriptor).as_deref() {
            Some(Descriptor::Directory { path, .. }) => Ok(path.clone()),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::EBADF),
        })?
    };
    fs::normalize(&base, &path).ok_or(Errno::ENOENT)
}

pub fn lookup(path: &str) -> Result<Node, Errno> {
    fs::lookup(path).ok_or(Errno::ENOENT)
}
