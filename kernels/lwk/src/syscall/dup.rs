//! dup, dup2, dup3: another number for an open file (offset shared). Flags: dup3 takes
//! O_CLOEXEC (close-on-exec on the new descriptor); any other flag is EINVAL, as on Linux.

use super::{Errno, Fd, SyscallResult};
use crate::job::{self, descriptors::DuplicateError};
use crate::linux::uapi;

const O_CLOEXEC: i32 = uapi::O_CLOEXEC as i32;

/// Also `fcntl`'s F_DUPFD.
pub fn duplicate_error(error: DuplicateError) -> Errno {
    match error {
        DuplicateError::NotOpen => Errno::EBADF,
        DuplicateError::TableFull => Errno::EMFILE,
    }
}

/// dup(oldfd): the lowest free descriptor, naming the same open file, without close-on-exec.
pub fn dup(fd: Fd) -> SyscallResult {
    job::with_process(|process| process.descriptors.duplicate(fd, 0, false)).map(u64::from).map_err(duplicate_error)
}

/// dup2(oldfd, newfd): `newfd` names the open file of `oldfd` (closing what it named),
/// without close-on-exec; equal descriptors just check `oldfd`.
pub fn dup2(from: Fd, to: Fd) -> SyscallResult {
    let (descriptor, replaced) = job::with_process(|process| {
        if from == to {
            return process.descriptors.get(from).map(|_| (to, None)).ok_or(Errno::EBADF);
        }
        process.descriptors.duplicate_to(from, to, false).map_err(duplicate_error)
    })?;
    // Dropped here, unlocked: a pipe's last end wakes the other side.
    drop(replaced);
    Ok(descriptor.into())
}

/// dup3(oldfd, newfd, flags): `dup2` that refuses equal descriptors.
pub fn dup3(from: Fd, to: Fd, flags: i32) -> SyscallResult {
    if from == to || flags & !O_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    let (descriptor, replaced) =
        job::with_process(|process| process.descriptors.duplicate_to(from, to, flags & O_CLOEXEC != 0)).map_err(duplicate_error)?;
    drop(replaced);
    Ok(descriptor.into())
}
