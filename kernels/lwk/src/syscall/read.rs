//! read(fd, buf, count): files read from their offset; standard input is always at end of
//! file (the job has no terminal); directories are EISDIR; pipes wait for data
//! (`crate::job::pipe`); XEMEM's notification descriptors wait for a signal
//! (`crate::xpmem::read_notifier`).

use super::{user, Call, Errno, SyscallResult};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor, pipe};

/// Reads from descriptor `descriptor` at `at` (its own offset, advanced, when `None`).
pub fn read_at(descriptor: u64, buffer: u64, len: u64, at: Option<u64>) -> SyscallResult {
    if let Some(handle) = files::remote_handle(descriptor) {
        return files::to_syscall_result(files::read(handle, buffer, len, at));
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
        None | Some(Descriptor::Pipe(_) | Descriptor::XpmemNotify { .. }) => Err(Errno::EBADF),
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

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    read_at(call.args[0], call.args[1], call.args[2], None)
}
