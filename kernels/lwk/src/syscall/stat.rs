//! stat, lstat, fstat, newfstatat: a `struct stat` for a path or a descriptor. Files and
//! directories as the file system describes them; the console streams as a pipe (a stream
//! with no terminal behind it), and pipes as pipes. There are no symbolic links: lstat is
//! stat, and newfstatat's AT_SYMLINK_NOFOLLOW changes nothing; its AT_EMPTY_PATH with an empty
//! path is the descriptor itself (glibc's fstat). Other flags are ignored.

use super::path::{self, AT_FDCWD};
use super::{open, user, Errno, Fd, SyscallResult, UserAddr};
use crate::enclave::files;
use crate::fs::Node;
use crate::job::{self, descriptors::Descriptor};
use crate::linux::stat;
use crate::linux::uapi;
use crate::linux_struct;

const S_IFIFO: u32 = uapi::S_IFIFO;
const BLOCK_SIZE: i64 = 4096;
const AT_EMPTY_PATH: i32 = uapi::AT_EMPTY_PATH as i32;
/// st_dev of the job's file system and of the console "pipe".
const FILE_SYSTEM_DEVICE: u64 = 0x2a;
const PIPE_DEVICE: u64 = 0xc;

/// Writes a `struct stat` for `node`.
fn write_stat(address: UserAddr, node: &Node) -> SyscallResult {
    let record = linux_struct!(stat {
        st_dev: FILE_SYSTEM_DEVICE,
        st_ino: node.inode,
        st_nlink: if node.is_directory() { 2u64 } else { 1 },
        st_mode: node.mode,
        st_size: node.len as i64,
        st_blksize: BLOCK_SIZE,
        st_blocks: node.len.div_ceil(512) as i64,
    });
    user::write_bytes(address, &record)?;
    Ok(0)
}

/// `stat` of `address` relative to `directory`: the host's file in a persistent enclave, else
/// the job's.
fn stat_path(directory: Fd, address: UserAddr, statbuf: UserAddr) -> SyscallResult {
    if let Some(result) = open::stat_on_host(directory, address, statbuf) {
        return result;
    }
    let node = path::lookup(&path::resolve(directory, address)?)?;
    write_stat(statbuf, &node)
}

pub fn stat(path: UserAddr, statbuf: UserAddr) -> SyscallResult {
    stat_path(AT_FDCWD, path, statbuf)
}

pub fn lstat(path: UserAddr, statbuf: UserAddr) -> SyscallResult {
    stat_path(AT_FDCWD, path, statbuf)
}

pub fn fstat(fd: Fd, statbuf: UserAddr) -> SyscallResult {
    if let Some(handle) = files::remote_handle(fd) {
        let attributes = files::attributes(handle).map_err(|error| Errno(error.unsigned_abs()))?;
        user::write_bytes(statbuf, &files::stat_record(&attributes))?;
        return Ok(0);
    }
    let node = job::with_process(|process| match process.descriptors.get(fd).as_deref_mut() {
        None => Err(Errno::EBADF),
        Some(
            Descriptor::Console
            | Descriptor::Xpmem
            | Descriptor::XpmemNotify { .. }
            | Descriptor::Pipe(_)
            | Descriptor::Epoll(_)
            | Descriptor::Socket(_),
        ) => Ok(None),
        Some(Descriptor::Remote { .. }) => Err(Errno::EBADF),
        Some(Descriptor::File { node, .. } | Descriptor::Directory { node, .. }) => Ok(Some(*node)),
    })?;
    match node {
        Some(node) => write_stat(statbuf, &node),
        None => {
            let record = linux_struct!(stat {
                st_dev: PIPE_DEVICE,
                st_ino: u64::from(fd) + 1,
                st_nlink: 1u64,
                st_mode: S_IFIFO | 0o600,
                st_blksize: BLOCK_SIZE,
            });
            user::write_bytes(statbuf, &record)?;
            Ok(0)
        }
    }
}

pub fn newfstatat(directory: Fd, path: UserAddr, statbuf: UserAddr, flags: i32) -> SyscallResult {
    if flags & AT_EMPTY_PATH != 0 && user::read_path(path)?.is_empty() {
        return fstat(directory, statbuf);
    }
    stat_path(directory, path, statbuf)
}
