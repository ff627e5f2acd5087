//! close(fd). A host file is closed on the host once no descriptor of any process names its
//! open file any more; a pipe end closes when the last descriptor naming it does.

use super::{Errno, Fd, SyscallResult};
use crate::enclave::files;
use crate::job;
use alloc::sync::Arc;

pub fn close(fd: Fd) -> SyscallResult {
    let handle = files::remote_handle(fd);
    let open = job::with_process(|process| process.descriptors.remove(fd)).ok_or(Errno::EBADF)?;
    if let Some(handle) = handle.filter(|_| Arc::strong_count(&open) == 1) {
        files::close(handle);
    }
    // Dropped here, unlocked: a pipe's last end wakes the other side.
    drop(open);
    Ok(0)
}
