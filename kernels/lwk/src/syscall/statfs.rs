//! statfs, fstatfs: the file system of a path or a descriptor. A host path or file (a
//! persistent enclave's job) as the host's `statfs` says, asked with the job user's rights
//! (Open MPI's `mmap` shared-memory component and UCX's `posix` transport ask it of /dev/shm,
//! and want tmpfs there); the job's own in-memory files as a read-only ramfs; the console
//! and pipes as Linux's pipefs, sockets as its sockfs, other descriptors (epoll, XEMEM) as
//! anonymous inodes.

use super::open;
use super::path::{self, AT_FDCWD};
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};
use crate::linux::uapi::{self, ANON_INODE_FS_MAGIC, PIPEFS_MAGIC, RAMFS_MAGIC, SOCKFS_MAGIC};
use crate::linux_struct;

/// `f_flags`' read-only bit (Linux's ST_RDONLY).
const ST_RDONLY: i64 = 1;

pub fn statfs(path: UserAddr, buffer: UserAddr) -> SyscallResult {
    if let Some(host_path) = open::host_path(AT_FDCWD, path) {
        return write_host_record(buffer, files::statfs_path(&host_path?));
    }
    path::lookup(&path::resolve(AT_FDCWD, path)?)?;
    write_own_record(buffer, RAMFS_MAGIC)
}

pub fn fstatfs(fd: Fd, buffer: UserAddr) -> SyscallResult {
    if let Some(handle) = files::remote_handle(fd) {
        return write_host_record(buffer, files::statfs_handle(handle));
    }
    let magic = job::with_process(|process| match process.descriptors.get(fd).as_deref() {
        None | Some(Descriptor::Remote { .. }) => Err(Errno::EBADF),
        Some(Descriptor::File { .. } | Descriptor::Directory { .. }) => Ok(RAMFS_MAGIC),
        Some(Descriptor::Console | Descriptor::Pipe(_)) => Ok(PIPEFS_MAGIC),
        Some(Descriptor::Socket(_)) => Ok(SOCKFS_MAGIC),
        Some(_) => Ok(ANON_INODE_FS_MAGIC),
    })?;
    write_own_record(buffer, magic)
}

fn write_host_record(buffer: UserAddr, record: Result<[u8; enclave_proto::STATFS_LEN], i64>) -> SyscallResult {
    let record = record.map_err(|error| Errno(error.unsigned_abs()))?;
    user::write_bytes(buffer, &record)?;
    Ok(0)
}

/// A file system of the kernel's own: its type, pages as blocks, no counts; the job's files
/// are read-only.
fn write_own_record(buffer: UserAddr, magic: u32) -> SyscallResult {
    let flags = if magic == RAMFS_MAGIC { ST_RDONLY } else { 0 };
    let record =
        linux_struct!(uapi::statfs { f_type: i64::from(magic), f_bsize: 4096i64, f_namelen: 255i64, f_frsize: 4096i64, f_flags: flags });
    user::write_bytes(buffer, &record)?;
    Ok(0)
}
