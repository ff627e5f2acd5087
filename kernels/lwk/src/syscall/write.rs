//! write, pwrite64, writev.
//!
//! write(fd, buf, count) to the console streams (0, 1, 2 unless closed) and pipes
//! (`crate::job::pipe`); files are read-only (EBADF).

use super::read::{read_iovec, IOV_MAX};
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::console;
use crate::enclave::{self, files};
use crate::job::{self, descriptors::Descriptor, pipe};

/// Copies through a bounded kernel buffer, so a huge write needs no huge allocation.
const CHUNK: usize = 4096;
/// What writev gathers for one pipe write at most (the pipe's capacity).
const GATHER_MAX: u64 = 64 * 1024;

fn write_to_descriptor(descriptor: Fd, address: UserAddr, len: u64) -> SyscallResult {
    if let Some(handle) = files::remote_handle(descriptor) {
        return files::to_syscall_result(files::write(handle, address.0, len));
    }
    if let Ok(socket) = super::socket::socket_of(descriptor) {
        return super::socket_io::send(&socket, &[(address, len)], 0, &[], &[]);
    }
    if let Some((end, non_blocking)) = job::pipe_end(descriptor) {
        return if end.is_writer() { pipe::write(&end, address, len, non_blocking) } else { Err(Errno::EBADF) };
    }
    match job::with_process(|process| {
        process.descriptors.get(descriptor).map(|open| (matches!(*open, Descriptor::Console), matches!(*open, Descriptor::Epoll(_))))
    }) {
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

pub fn write(fd: Fd, buffer: UserAddr, count: usize) -> SyscallResult {
    write_to_descriptor(fd, buffer, count as u64)
}

/// pwrite64(fd, buf, count, offset): host files of a persistent enclave, at an offset; the
/// console streams cannot seek (ESPIPE); the job's own files are read-only (EBADF).
pub fn pwrite64(fd: Fd, buffer: UserAddr, count: usize, offset: i64) -> SyscallResult {
    if offset < 0 {
        return Err(Errno::EINVAL);
    }
    if let Some(handle) = files::remote_handle(fd) {
        return files::to_syscall_result(files::write_at(handle, buffer.0, count as u64, offset as u64));
    }
    job::with_process(|process| match process.descriptors.get(fd).as_deref() {
        Some(Descriptor::Console | Descriptor::Pipe(_)) => Err(Errno::ESPIPE),
        _ => Err(Errno::EBADF),
    })
}

/// writev(fd, iov, iovcnt): each `struct iovec { base, len }` in turn, as `write`; to a pipe
/// vectors of up to 64 KiB together go as one write (gathered first), so that a reader sees
/// them together, as on Linux.
pub fn writev(fd: Fd, vector: UserAddr, count: i32) -> SyscallResult {
    if !(0..=IOV_MAX).contains(&count) {
        return Err(Errno::EINVAL);
    }
    if let Ok(socket) = super::socket::socket_of(fd) {
        return super::socket_io::send(&socket, &super::socket_io::iovecs(vector, count as u64)?, 0, &[], &[]);
    }
    if let Some((end, non_blocking)) = job::pipe_end(fd) {
        if !end.is_writer() {
            return Err(Errno::EBADF);
        }
        let mut vectors = alloc::vec::Vec::new();
        for index in 0..count as u64 {
            vectors.push(read_iovec(vector, index)?);
        }
        if vectors.iter().try_fold(0u64, |total, (_, len)| total.checked_add(*len)).is_some_and(|total| total <= GATHER_MAX) {
            let total: u64 = vectors.iter().map(|(_, len)| len).sum();
            let mut gathered = alloc::vec![0; total as usize];
            let mut at = 0;
            for (base, len) in vectors {
                user::read_into(base, &mut gathered[at..at + len as usize])?;
                at += len as usize;
            }
            return pipe::write_from(&end, total, non_blocking, |offset, piece| {
                piece.copy_from_slice(&gathered[offset as usize..offset as usize + piece.len()]);
                Ok(())
            });
        }
    }
    let mut total = 0;
    for index in 0..count as u64 {
        let (base, len) = read_iovec(vector, index)?;
        if len > 0 {
            total += write_to_descriptor(fd, base, len)?;
        }
    }
    Ok(total)
}
