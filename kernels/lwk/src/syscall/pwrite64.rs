//! pwrite64(fd, buf, count, offset): host files of a persistent enclave, at an offset; the
//! console streams cannot seek (ESPIPE); the job's own files are read-only (EBADF).

use super::{Call, Errno, SyscallResult};
use crate::enclave::files;
use crate::job::{self, descriptors::Descriptor};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [descriptor, buffer, len, offset, ..] = call.args;
    if (offset as i64) < 0 {
        return Err(Errno::EINVAL);
    }
    if let Some(handle) = files::remote_handle(descriptor) {
        return files::to_syscall_result(files::write_at(handle, buffer, len, offset));
    }
    job::with_process(|process| match process.descriptors.get(descriptor).as_deref() {
        Some(Descriptor::Console | Descriptor::Pipe(_)) => Err(Errno::ESPIPE),
        _ => Err(Errno::EBADF),
    })
}
