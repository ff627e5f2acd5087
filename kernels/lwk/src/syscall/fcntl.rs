//! fcntl(fd, cmd, arg): F_DUPFD and F_DUPFD_CLOEXEC; F_GETFD/F_SETFD (close-on-exec is
//! accepted: there is no exec); F_GETFL (files and standard input read-only, standard output
//! and error write-only), F_SETFL accepted. Other commands EINVAL.

use super::dup::duplicate_error;
use super::{Call, Errno, SyscallResult};
use crate::job::{self, descriptors::Descriptor};

const F_DUPFD: u64 = 0;
const F_GETFD: u64 = 1;
const F_SETFD: u64 = 2;
const F_GETFL: u64 = 3;
const F_SETFL: u64 = 4;
const F_DUPFD_CLOEXEC: u64 = 1030;
const O_WRONLY: u64 = 1;
const O_DIRECTORY: u64 = 0o200000;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [descriptor, command, argument, ..] = call.args;
    job::with_process(|process| match command {
        F_DUPFD | F_DUPFD_CLOEXEC => process.descriptors.duplicate(descriptor, argument).map_err(duplicate_error),
        F_GETFD | F_SETFD | F_SETFL | F_GETFL => {
            let flags = match process.descriptors.get(descriptor).as_deref() {
                None => return Err(Errno::EBADF),
                Some(Descriptor::Console) if descriptor as u32 != 0 => O_WRONLY,
                Some(Descriptor::Directory { .. }) => O_DIRECTORY,
                Some(Descriptor::Remote { status_flags, .. }) => *status_flags as u64,
                Some(_) => 0,
            };
            Ok(if command == F_GETFL { flags } else { 0 })
        }
        _ => Err(Errno::EINVAL),
    })
}
