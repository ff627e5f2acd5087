//! openat(dirfd, path, flags, mode): files and directories of the job's read-only file
//! system. Opening for writing, or creating, is EROFS; a missing path ENOENT; O_DIRECTORY on a
//! file ENOTDIR; directories open read-only for `getdents64`.

use super::{path, user, Call, Errno, SyscallResult};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};

const O_ACCMODE: u64 = 3;
const O_CREAT: u64 = 0o100;
const O_DIRECTORY: u64 = 0o200000;
const EROFS: Errno = Errno(30);
const EMFILE: Errno = Errno(24);
const AT_FDCWD: i32 = -100;

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

/// In a persistent enclave, a path the job's file system lacks, relative to the working
/// directory or absolute under it, is opened on the host; `None` when it is not the host's.
pub fn open_on_host(directory: u64, address: u64, flags: u64, mode: u64) -> Option<SyscallResult> {
    if !crate::enclave::is_active() || path::resolve(directory, address).and_then(|path| path::lookup(&path)).is_ok() {
        return None;
    }
    let raw = match user::read_path(address) {
        Ok(raw) => raw,
        Err(errno) => return Some(Err(errno)),
    };
    // Relative to another directory descriptor: those are the job's own (in memory).
    if !raw.starts_with('/') && directory as u32 as i32 != AT_FDCWD {
        return None;
    }
    files::open(&raw, flags as u32, mode as u32).map(files::to_syscall_result)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    if let Some(result) = open_on_host(call.args[0], call.args[1], call.args[2], call.args[3]) {
        return result;
    }
    open(call.args[0], call.args[1], call.args[2])
}
