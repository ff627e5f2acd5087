//! lseek(fd, offset, whence): SEEK_SET, SEEK_CUR and SEEK_END on files (past the end is
//! allowed, reads there return 0); the console cannot seek (ESPIPE).

use super::{Errno, Fd, SyscallResult};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};
use crate::linux_consts;

linux_consts!(u32: SEEK_SET, SEEK_CUR, SEEK_END);

pub fn lseek(descriptor: Fd, offset: i64, whence: u32) -> SyscallResult {
    if let Some(handle) = files::remote_handle(descriptor) {
        return files::to_syscall_result(files::seek(handle, offset, whence));
    }
    job::with_process(|process| match process.descriptors.get(descriptor).as_deref_mut() {
        None => Err(Errno::EBADF),
        Some(
            Descriptor::Console
            | Descriptor::Xpmem
            | Descriptor::XpmemNotify { .. }
            | Descriptor::Pipe(_)
            | Descriptor::Epoll(_)
            | Descriptor::Socket(_),
        ) => Err(Errno::ESPIPE),
        Some(Descriptor::Directory { .. }) => Err(Errno::EINVAL),
        Some(Descriptor::Remote { .. }) => Err(Errno::EBADF),
        Some(Descriptor::File { node, offset: current }) => {
            let base = match whence {
                SEEK_SET => 0,
                SEEK_CUR => *current as i64,
                SEEK_END => node.len as i64,
                _ => return Err(Errno::EINVAL),
            };
            let position = base.checked_add(offset).filter(|&position| position >= 0).ok_or(Errno::EINVAL)?;
            *current = position as u64;
            Ok(position as u64)
        }
    })
}
