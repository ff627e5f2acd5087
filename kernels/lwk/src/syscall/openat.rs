//! openat(dirfd, path, flags, mode): files and directories of the job's read-only file
//! system. Opening for writing, or creating, is EROFS; a missing path ENOENT; O_DIRECTORY on a
//! file ENOTDIR; directories open read-only for `getdents64`.

use super::{path, Call, Errno, SyscallResult};
use crate::job::{self, descriptors::Descriptor};

const O_ACCMODE: u64 = 3;
const O_CREAT: u64 = 0o100;
const O_DIRECTORY: u64 = 0o200000;
const EROFS: Errno = Errno(30);
const EMFILE: Errno = Errno(24);

pub fn open(directory: u64, address: u64, flags: u64) -> SyscallResult {
    let path = path::resolve(directory, address)?;
    let node = match path::lookup(&path) {
        Ok(node) => node,
        Err(_) if flags & O_CREAT != 0 => return Err(EROFS),
        Err(error) => return Err(error),
    };
    if flags & O_ACCMODE != 0 {
        return Err(if node.is_directory() { Errno::EISDIR } else { EROFS });
    }
    let descriptor = if node.is_directory() {
        Descriptor::Directory { path, node, position: 0 }
    } else if flags & O_DIRECTORY != 0 {
        return Err(Errno::ENOTDIR);
    } else {
        Descriptor::File { node, offset: 0 }
    };
    job::with_process(|process| process.descriptors.insert(descriptor)).ok_or(EMFILE)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    open(call.args[0], call.args[1], call.args[2])
}
