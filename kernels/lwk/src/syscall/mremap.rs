//! mremap(old, old_len, new_len, flags): heap mappings shrink, grow in place, or move with
//! MREMAP_MAYMOVE. MREMAP_FIXED is not supported.

use super::{Call, Errno, SyscallResult};
use crate::job;
use crate::job::memory::MemoryError;

const MREMAP_MAYMOVE: u64 = 1;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, old_len, new_len, flags, ..] = call.args;
    if flags & !MREMAP_MAYMOVE != 0 {
        return Err(Errno::EINVAL);
    }
    job::with_process(|process| process.memory.remap(address, old_len, new_len, flags & MREMAP_MAYMOVE != 0)).map_err(|error| match error {
        MemoryError::NoMemory => Errno::ENOMEM,
        MemoryError::InvalidArgument => Errno::EINVAL,
    })
}
