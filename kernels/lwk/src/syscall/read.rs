//! read, pread64, readv.
//!
//! read(fd, buf, count): files read from their offset; standard input is always at end of
//! file (the job has no terminal); directories are EISDIR; pipes wait for data
//! (`crate::job::pipe`); XEMEM's notification descriptors wait for a signal
//! (`crate::xpmem::read_notifier`).

use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor, pipe};
use crate::linux::iovec;
use crate::linux_field;
use core::mem::size_of;

/// Linux's UIO_MAXIOV: the most vectors one readv or writev takes.
pub const IOV_MAX: i32 = 1024;

/// Entry `index` of the `struct iovec` array at `vector`: its base and length.
pub fn read_iovec(vector: UserAddr, index: u64) -> Result<(UserAddr, u64), Errno> {
    let mut bytes = [0u8; size_of::<iovec>()];
    user::read_into(vector + index * size_of::<iovec>() as u64, &mut bytes)?;
    Ok((UserAddr(linux_field!(&bytes, iovec, iov_base)), linux_field!(&bytes, iovec, iov_len)))
}

/// Reads from descriptor `descriptor` at `at` (its own offset, advanced, when `None`).
fn read_at(descriptor: Fd, buffer: UserAddr, len: u64, at: Option<u64>) -> SyscallResult {
    if let Some(handle) = files::remote_handle(descriptor) {
        return files::to_syscall_result(files::read(handle, buffer.0, len, at));
    }
    if let Ok(socket) = super::socket::socket_of(descriptor) {
        return match at {
            Some(_) => Err(Errno::ESPIPE),
            None => super::socket_io::receive(&socket, &[(buffer, len)], 0),
        };
    }
    if let Some((end, non_blocking)) = job::pipe_end(descriptor) {
        return match (end.is_writer(), at) {
            (true, _) => Err(Errno::EBADF),
            (false, Some(_)) => Err(Errno::ESPIPE),
            (false, None) => pipe::read(&end, buffer, len, non_blocking),
        };
    }
    // XEMEM's notification descriptor: waits (unless O_NONBLOCK) for a signal's count,
    // holding only its own handle on the counter.
    let notifier = job::with_process(|process| match process.descriptors.get(descriptor).as_deref() {
        Some(Descriptor::XpmemNotify { notifier, non_blocking }) => Some((notifier.clone(), *non_blocking)),
        _ => None,
    });
    if let Some((notifier, non_blocking)) = notifier {
        return match at {
            Some(_) => Err(Errno::ESPIPE),
            None => crate::xpmem::read_notifier(&notifier, buffer, len, non_blocking),
        };
    }
    job::with_process(|process| match process.descriptors.get(descriptor).as_deref_mut() {
        None | Some(Descriptor::Pipe(_) | Descriptor::XpmemNotify { .. } | Descriptor::Socket(_)) => Err(Errno::EBADF),
        Some(Descriptor::Console) => Ok(0),
        Some(Descriptor::Directory { .. }) => Err(Errno::EISDIR),
        Some(Descriptor::Remote { .. }) => Err(Errno::EBADF),
        Some(Descriptor::Xpmem | Descriptor::Epoll(_)) => Err(Errno::EINVAL),
        Some(Descriptor::File { node, offset }) => {
            let start = at.unwrap_or(*offset).min(node.len);
            let count = len.min(node.len - start);
            user::write_bytes(buffer, &node.contents()[start as usize..(start + count) as usize])?;
            if at.is_none() {
                *offset = start + count;
            }
            Ok(count)
        }
    })
}

pub fn read(fd: Fd, buffer: UserAddr, count: usize) -> SyscallResult {
    read_at(fd, buffer, count as u64, None)
}

/// pread64(fd, buf, count, offset): a read at `offset` that leaves the file offset alone.
pub fn pread64(fd: Fd, buffer: UserAddr, count: usize, offset: i64) -> SyscallResult {
    if offset < 0 {
        return Err(Errno::EINVAL);
    }
    read_at(fd, buffer, count as u64, Some(offset as u64))
}

/// readv(fd, iov, iovcnt): `read` into each `struct iovec` in turn, stopping at a short read.
pub fn readv(fd: Fd, vector: UserAddr, count: i32) -> SyscallResult {
    if !(0..=IOV_MAX).contains(&count) {
        return Err(Errno::EINVAL);
    }
    if let Ok(socket) = super::socket::socket_of(fd) {
        return super::socket_io::receive(&socket, &super::socket_io::iovecs(vector, count as u64)?, 0);
    }
    let mut total = 0;
    for index in 0..count as u64 {
        let (base, len) = read_iovec(vector, index)?;
        let got = read_at(fd, base, len, None)?;
        total += got;
        if got < len {
            break;
        }
    }
    Ok(total)
}
