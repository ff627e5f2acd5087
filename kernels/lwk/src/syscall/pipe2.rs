//! pipe2(fds, flags): a pipe (`crate::job::pipe`), its read end in fds[0], its write end in
//! fds[1]. Flags: O_CLOEXEC, O_NONBLOCK; others EINVAL.

use super::{user, Call, Errno, SyscallResult};
use crate::job::{self, descriptors::Descriptor, pipe};

const O_NONBLOCK: u64 = 0o4000;
const O_CLOEXEC: u64 = 0o2000000;
const EMFILE: Errno = Errno(24);

pub fn make_pipe(fds: u64, flags: u64) -> SyscallResult {
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
    .ok_or(EMFILE)?;
    let words = [read_fd as u32, write_fd as u32];
    if let Err(errno) = user::write_bytes(fds, &[words[0].to_le_bytes(), words[1].to_le_bytes()].concat()) {
        job::with_process(|process| {
            process.descriptors.remove(read_fd);
            process.descriptors.remove(write_fd);
        });
        return Err(errno);
    }
    Ok(0)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    make_pipe(call.args[0], call.args[1])
}
