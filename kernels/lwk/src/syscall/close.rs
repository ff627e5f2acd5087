//! close(fd).

use super::{Call, Errno, SyscallResult};
use crate::enclave::files;
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    // A host file is closed on the host too (a `dup`licate closes the host's handle as well).
    if let Some(handle) = files::remote_handle(call.args[0]) {
        files::close(handle);
    }
    job::with_process(|process| process.descriptors.remove(call.args[0])).map(|_| 0).ok_or(Errno::EBADF)
}
