//! writev(fd, iov, iovcnt): each `struct iovec { base, len }` in turn, as `write`; to a pipe
//! vectors of up to 64 KiB together go as one write (gathered first), so that a reader sees
//! them together, as on Linux.

use super::write::write_to_descriptor;
use super::{user, Call, Errno, SyscallResult};
use crate::job::{self, pipe};

const IOV_MAX: u64 = 1024;
/// What is gathered for one pipe write at most (the pipe's capacity).
const GATHER_MAX: u64 = 64 * 1024;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [descriptor, vector, count, ..] = call.args;
    if count > IOV_MAX {
        return Err(Errno::EINVAL);
    }
    if let Some((end, non_blocking)) = job::pipe_end(descriptor) {
        if !end.is_writer() {
            return Err(Errno::EBADF);
        }
        let mut vectors = alloc::vec::Vec::new();
        for index in 0..count {
            vectors.push(user::read_words::<2>(vector + index * 16)?);
        }
        if vectors.iter().try_fold(0u64, |total, [_, len]| total.checked_add(*len)).is_some_and(|total| total <= GATHER_MAX) {
            let total: u64 = vectors.iter().map(|[_, len]| len).sum();
            let mut gathered = alloc::vec![0; total as usize];
            let mut at = 0;
            for [base, len] in vectors {
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
    for index in 0..count {
        let [base, len] = user::read_words::<2>(vector + index * 16)?;
        if len > 0 {
            total += write_to_descriptor(descriptor, base, len)?;
        }
    }
    Ok(total)
}
