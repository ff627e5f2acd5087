//! openat(dirfd, path, flags, mode): files and directories of the job's read-only file
//! system. Opening for writing, or creating, is EROFS; a missing path ENOENT; O_DIRECTORY on a
//! file ENOTDIR; directories open read-only for `getdents64`.

use super::{path, user, Call, Errno, SyscallResult};
use alloc::string::String;
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};

const O_ACCMODE: u64 = 3;
const O_CREAT: u64 = 0o100;
const O_DIRECTORY: u64 = 0o200000;
const O_CLOEXEC: u64 = 0o2000000;
const EROFS: Errno = Errno(30);
const EMFILE: Errno = Errno(24);
const AT_FDCWD: i32 = -100;

pub fn open(directory: u64, address: u64, flags: u64) -> SyscallResult {
    let path = path::resolve(directory, address)?;
    if path == crate::xpmem::DEVICE_PATH {
        return job::with_process(|process| process.descriptors.insert(Descriptor::Xpmem)).ok_or(EMFILE);
    }
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
    job::with_process(|process| process.descriptors.insert_flagged(descriptor, flags & O_CLOEXEC != 0)).ok_or(EMFILE)
}

/// In a persistent enclave, a path the job's file system lacks, relative to the working
/// directory or absolute under it, is the host's: returns it as the job wrote it (the host
/// resolves it in the job's working directory), `None` when the path is the enclave's own.
pub fn host_path(directory: u64, address: u64) -> Option<Result<String, Errno>> {
    // The kernel's own device, never the host's.
    if path::resolve(directory, address).is_ok_and(|path| path == crate::xpmem::DEVICE_PATH) {
        return None;
    }
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
    files::is_host_path(&raw).then_some(Ok(raw))
}

/// `open`/`openat` of a host path: the call goes to the host.
pub fn open_on_host(directory: u64, address: u64, flags: u64, mode: u64) -> Option<SyscallResult> {
    Some(match host_path(directory, address)? {
        Ok(path) => files::to_syscall_result(files::open(&path, flags as u32, mode as u32)),
        Err(errno) => Err(errno),
    })
}

/// `stat` and friends of a host path: the host's attributes written as a `struct stat`.
pub fn stat_on_host(directory: u64, address: u64, stat: u64) -> Option<SyscallResult> {
    let path = match host_path(directory, address)? {
        Ok(path) => path,
        Err(errno) => return Some(Err(errno)),
    };
    Some(match files::stat_path(&path) {
        Ok(attributes) => user::write_words(stat, &files::stat_words(&attributes)).map(|_| 0),
        Err(error) => files::to_syscall_result(error),
    })
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    if let Some(result) = open_on_host(call.args[0], call.args[1], call.args[2], call.args[3]) {
        return result;
    }
    open(call.args[0], call.args[1], call.args[2])
}
