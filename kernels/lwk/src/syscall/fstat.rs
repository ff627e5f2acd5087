//! fstat(fd, statbuf): files and directories as the file system describes them; the console
//! streams as a pipe (a stream with no terminal behind it), and pipes as pipes.

use super::{user, Call, Errno, SyscallResult};
use crate::fs::Node;
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};

const S_IFIFO: u64 = 0o010000;
/// st_dev of the job's file system and of the console "pipe".
const FILE_SYSTEM_DEVICE: u64 = 0x2a;
const PIPE_DEVICE: u64 = 0xc;

/// Writes a `struct stat` (144 bytes on x86-64) for `node`.
pub fn write_stat(address: u64, node: &Node) -> SyscallResult {
    let mut stat = [0u64; 18];
    stat[0] = FILE_SYSTEM_DEVICE;
    stat[1] = node.inode;
    stat[2] = if node.is_directory() { 2 } else { 1 }; // st_nlink
    stat[3] = node.mode as u64; // st_mode (32 bits), st_uid 0
    stat[6] = node.len; // st_size
    stat[7] = 4096; // st_blksize
    stat[8] = node.len.div_ceil(512); // st_blocks
    user::write_words(address, &stat)?;
    Ok(0)
}

pub fn stat_descriptor(descriptor: u64, address: u64) -> SyscallResult {
    if let Some(handle) = files::remote_handle(descriptor) {
        let attributes = files::attributes(handle).map_err(|error| Errno(error.unsigned_abs()))?;
        user::write_words(address, &files::stat_words(&attributes))?;
        return Ok(0);
    }
    let node = job::with_process(|process| match process.descriptors.get(descriptor).as_deref_mut() {
        None => Err(Errno::EBADF),
        Some(Descriptor::Console | Descriptor::Xpmem | Descriptor::XpmemNotify { .. } | Descriptor::Pipe(_) | Descriptor::Epoll(_)) => Ok(None),
        Some(Descriptor::Remote { .. }) => Err(Errno::EBADF),
        Some(Descriptor::File { node, .. } | Descriptor::Directory { node, .. }) => Ok(Some(*node)),
    })?;
    match node {
        Some(node) => write_stat(address, &node),
        None => {
            let mut stat = [0u64; 18];
            stat[0] = PIPE_DEVICE;
            stat[1] = descriptor + 1; // st_ino
            stat[2] = 1; // st_nlink
            stat[3] = S_IFIFO | 0o600; // st_mode, st_uid 0
            stat[7] = 4096; // st_blksize
            user::write_words(address, &stat)?;
            Ok(0)
        }
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    stat_descriptor(call.args[0], call.args[1])
}
