//! dup3(oldfd, newfd, flags): `dup2` that refuses equal descriptors; O_CLOEXEC sets
//! close-on-exec on `newfd`.

use super::dup::duplicate_error;
use super::{Call, Errno, SyscallResult};
use crate::job;

const O_CLOEXEC: u64 = 0o2000000;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [from, to, flags, ..] = call.args;
    if from as u32 == to as u32 || flags & !O_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    let (descriptor, replaced) = job::with_process(|process| process.descriptors.duplicate_to(from, to, flags & O_CLOEXEC != 0)).map_err(duplicate_error)?;
    drop(replaced);
    Ok(descriptor)
}
