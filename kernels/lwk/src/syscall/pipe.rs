//! pipe, pipe2: a pipe (`crate::job::pipe`), its read end in fds[0], its write end in fds[1].
//! Flags: O_CLOEXEC, O_NONBLOCK; others EINVAL (Linux's O_DIRECT packet mode is not here).

use super::{user, Errno, SyscallResult, UserAddr};
use crate::job::{self, descriptors::Descriptor, pipe};
use crate::linux_consts;

linux_consts!(i32: O_NONBLOCK, O_CLOEXEC);

pub fn pipe(fds: UserAddr) -> SyscallResult {
    pipe2(fds, 0)
}

pub fn pipe2(fds: UserAddr, flags: i32) -> SyscallResult {
    if flags & !(O_NONBLOCK | O_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    let close_on_exec = flags & O_CLOEXEC != 0;
    let (read_end, write_end) = pipe::new(flags & O_NONBLOCK != 0);
    let (read_fd, write_fd) = job::with_process(|process| {
        let read_fd = process.descriptors.insert_flagged(Descriptor::Pipe(read_end), close_on_exec)?;
        match process.descriptors.insert_flagged(Descriptor::Pipe(write_end), close_on_exec) {
            Some(write_fd) => Some((read_fd, write_fd)),
            None => {
                process.descriptors.remove(read_fd);
                None
            }
        }
    })
    .ok_or(Errno::EMFILE)?;
    if let Err(errno) = user::write_bytes(fds, &[read_fd.0.to_le_bytes(), write_fd.0.to_le_bytes()].concat()) {
        job::with_process(|process| {
            process.descriptors.remove(read_fd);
            process.descriptors.remove(write_fd);
        });
        return Err(errno);
    }
    Ok(0)
}
