//! dup(oldfd): the lowest free descriptor, naming the same open file (offset shared), without
//! close-on-exec.

use super::{Call, Errno, SyscallResult};
use crate::job::{self, descriptors::DuplicateError};

pub fn duplicate_error(error: DuplicateError) -> Errno {
    match error {
        DuplicateError::NotOpen => Errno::EBADF,
        DuplicateError::TableFull => Errno(24), // EMFILE
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    job::with_process(|process| process.descriptors.duplicate(call.args[0], 0, false)).map_err(duplicate_error)
}
