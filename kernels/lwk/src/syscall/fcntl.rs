//! fcntl(fd, cmd, arg): F_DUPFD and F_DUPFD_CLOEXEC; F_GETFD/F_SETFD (FD_CLOEXEC, which
//! `execve` honours); F_GETFL (files and standard input read-only, standard output and error
//! write-only, pipe ends by their side, O_NONBLOCK on pipes and XEMEM notification
//! descriptors, which are read-write as eventfds, and sockets), F_SETFL (O_NONBLOCK on those; accepted and
//! ignored elsewhere). Other commands EINVAL.

use super::dup::duplicate_error;
use super::{Errno, Fd, SyscallResult};
use crate::job::{self, descriptors::Descriptor};
use crate::linux_consts;

linux_consts!(u32: F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC; u64: O_WRONLY, O_RDWR, O_NONBLOCK, FD_CLOEXEC, O_DIRECTORY);

pub fn fcntl(descriptor: Fd, command: u32, argument: u64) -> SyscallResult {
    job::with_process(|process| match command {
        F_DUPFD | F_DUPFD_CLOEXEC => {
            process.descriptors.duplicate(descriptor, argument, command == F_DUPFD_CLOEXEC).map(u64::from).map_err(duplicate_error)
        }
        F_GETFD => process.descriptors.close_on_exec(descriptor).map(|flag| flag as u64 * FD_CLOEXEC).ok_or(Errno::EBADF),
        F_SETFD => process.descriptors.set_close_on_exec(descriptor, argument & FD_CLOEXEC != 0).map(|()| 0).ok_or(Errno::EBADF),
        F_SETFL | F_GETFL => {
            let mut open = process.descriptors.get(descriptor).ok_or(Errno::EBADF)?;
            let flags = match &mut *open {
                Descriptor::Console if descriptor != Fd(0) => O_WRONLY,
                Descriptor::Directory { .. } => O_DIRECTORY,
                Descriptor::Epoll(_) => O_RDWR,
                Descriptor::Remote { status_flags, .. } => *status_flags as u64,
                Descriptor::XpmemNotify { non_blocking, .. } => {
                    if command == F_SETFL {
                        *non_blocking = argument & O_NONBLOCK != 0;
                    }
                    O_RDWR | (*non_blocking as u64 * O_NONBLOCK)
                }
                Descriptor::Socket(socket) => {
                    if command == F_SETFL {
                        socket.set_non_blocking(argument & O_NONBLOCK != 0);
                    }
                    O_RDWR | (socket.non_blocking() as u64 * O_NONBLOCK)
                }
                Descriptor::Pipe(end) => {
                    if command == F_SETFL {
                        end.non_blocking = argument & O_NONBLOCK != 0;
                    }
                    (end.is_writer() as u64 * O_WRONLY) | (end.non_blocking as u64 * O_NONBLOCK)
                }
                _ => 0,
            };
            Ok(if command == F_GETFL { flags } else { 0 })
        }
        _ => Err(Errno::EINVAL),
    })
}
