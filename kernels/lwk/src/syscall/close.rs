//! close(fd).

use super::{Call, Errno, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    job::with_process(|process| process.descriptors.remove(call.args[0])).map(|_| 0).ok_or(Errno::EBADF)
}
