//! open, openat: files and directories of the job's read-only file system (and, in a
//! persistent enclave, the host's files, `crate::enclave::files`). Flags: the access mode must
//! be O_RDONLY (else EROFS, or EISDIR for a directory); O_CREAT of a missing path is EROFS,
//! O_CREAT|O_EXCL of an existing one EEXIST;
//! O_DIRECTORY on a file is ENOTDIR; O_CLOEXEC sets close-on-exec; the other flags are ignored
//! here and passed to the host for its files. A missing path is ENOENT; directories open
//! read-only for `getdents64`.

use super::path::{self, AT_FDCWD};
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};
use crate::linux_consts;
use alloc::string::String;

linux_consts!(i32: O_ACCMODE, O_CREAT, O_EXCL, O_DIRECTORY, O_CLOEXEC);

pub fn open(path: UserAddr, flags: i32, mode: u32) -> SyscallResult {
    openat(AT_FDCWD, path, flags, mode)
}

pub fn openat(directory: Fd, path: UserAddr, flags: i32, mode: u32) -> SyscallResult {
    if let Some(result) = open_on_host(directory, path, flags, mode) {
        return result;
    }
    open_in_job(directory, path, flags)
}

/// `openat` of the job's own file system (or `/dev/xpmem`).
fn open_in_job(directory: Fd, address: UserAddr, flags: i32) -> SyscallResult {
    let path = path::resolve(directory, address)?;
    if path == crate::xpmem::DEVICE_PATH {
        return job::with_process(|process| process.descriptors.insert(Descriptor::Xpmem)).map(u64::from).ok_or(Errno::EMFILE);
    }
    let node = match path::lookup(&path) {
        Ok(node) => node,
        Err(_) if flags & O_CREAT != 0 => return Err(Errno::EROFS),
        Err(error) => return Err(error),
    };
    if flags & (O_CREAT | O_EXCL) == O_CREAT | O_EXCL {
        // Linux checks existence before the file's kind: O_EXCL of a directory is EEXIST too.
        return Err(Errno::EEXIST);
    }
    if flags & O_ACCMODE != 0 {
        return Err(if node.is_directory() { Errno::EISDIR } else { Errno::EROFS });
    }
    let descriptor = if node.is_directory() {
        Descriptor::Directory { path, node, position: 0 }
    } else if flags & O_DIRECTORY != 0 {
        return Err(Errno::ENOTDIR);
    } else {
        Descriptor::File { node, offset: 0 }
    };
    job::with_process(|process| process.descriptors.insert_flagged(descriptor, flags & O_CLOEXEC != 0)).map(u64::from).ok_or(Errno::EMFILE)
}

/// In a persistent enclave, a path the job's file system lacks (relative to the working
/// directory, or absolute) is the host's: returns it as the job wrote it (the host resolves it
/// from the job's working directory), `None` when the path is the enclave's own. The path is
/// read from the job once: each byte read is emulated kernel work on PVM.
pub fn host_path(directory: Fd, address: UserAddr) -> Option<Result<String, Errno>> {
    if !crate::enclave::is_active() {
        return None;
    }
    let raw = match user::read_path(address) {
        Ok(raw) => raw,
        Err(errno) => return Some(Err(errno)),
    };
    // Relative to another directory descriptor: those are the job's own (in memory).
    if !raw.starts_with('/') && directory != AT_FDCWD {
        return None;
    }
    // The kernel's own device and the job's own files, never the host's.
    if path::resolve_text(directory, &raw).is_ok_and(|path| path == crate::xpmem::DEVICE_PATH || path::lookup(&path).is_ok()) {
        return None;
    }
    files::is_host_path(&raw).then_some(Ok(raw))
}

/// `open`/`openat` of a host path: the call goes to the host.
fn open_on_host(directory: Fd, address: UserAddr, flags: i32, mode: u32) -> Option<SyscallResult> {
    Some(match host_path(directory, address)? {
        Ok(path) => files::to_syscall_result(files::open(&path, flags as u32, mode)),
        Err(errno) => Err(errno),
    })
}

/// `stat` and friends of a host path: the host's attributes written as a `struct stat`.
pub fn stat_on_host(directory: Fd, address: UserAddr, stat: UserAddr) -> Option<SyscallResult> {
    let path = match host_path(directory, address)? {
        Ok(path) => path,
        Err(errno) => return Some(Err(errno)),
    };
    Some(match files::stat_path(&path) {
        Ok(attributes) => user::write_bytes(stat, &files::stat_record(&attributes)).map(|_| 0),
        Err(error) => files::to_syscall_result(error),
    })
}
