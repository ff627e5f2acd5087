//! write(fd, buf, count) to the console streams (0, 1, 2 unless closed) and pipes
//! (`crate::job::pipe`); files are read-only (EBADF).

use super::{user, Call, Errno, SyscallResult};
use crate::console;
use crate::enclave;
use crate::job::{self, descriptors::Descriptor, pipe};

/// Copies through a bounded kernel buffer, so a huge write needs no huge allocation.
const CHUNK: usize = 4096;

pub fn write_to_descriptor(descriptor: u64, address: u64, len: u64) -> SyscallResult {
    if let Some(handle) = enclave::files::remote_handle(descriptor) {
        return enclave::files::to_syscall_result(enclave::files::write(handle, address, len));
    }
    if let Some((end, non_blocking)) = job::pipe_end(descriptor) {
        return if end.is_writer() { pipe::write(&end, address, len, non_blocking) } else { Err(Errno::EBADF) };
    }
    match job::with_process(|process| process.descriptors.get(descriptor).map(|open| (matches!(*open, Descriptor::Console), matches!(*open, Descriptor::Epoll(_))))) {
        Some((true, _)) => {}
        // Linux's epoll descriptors have no write method.
        Some((_, true)) => return Err(Errno::EINVAL),
        _ => return Err(Errno::EBADF),
    }
    let mut written = 0;
    while written < len {
        let chunk = (len - written).min(CHUNK as u64);
        match user::read_bytes(address + written, chunk as usize) {
            // A persistent enclave's job writes to the user's terminal, through the host.
            Ok(bytes) if enclave::is_active() => enclave::job_output(descriptor, &bytes),
            Ok(bytes) => console::write_job_output(&bytes),
            Err(errno) if written == 0 => return Err(errno),
            Err(_) => break,
        }
        written += chunk;
    }
    Ok(written)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    write_to_descriptor(call.args[0], call.args[1], call.args[2])
}
