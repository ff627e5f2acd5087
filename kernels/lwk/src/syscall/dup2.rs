//! dup2(oldfd, newfd): `newfd` names the open file of `oldfd` (closing what it named),
//! without close-on-exec; equal descriptors just check `oldfd`.

use super::dup::duplicate_error;
use super::{Call, Errno, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [from, to, ..] = call.args;
    let (descriptor, replaced) = job::with_process(|process| {
        if from as u32 == to as u32 {
            return process.descriptors.get(from).map(|_| (to as u32 as u64, None)).ok_or(Errno::EBADF);
        }
        process.descriptors.duplicate_to(from, to, false).map_err(duplicate_error)
    })?;
    drop(replaced);
    Ok(descriptor)
}
