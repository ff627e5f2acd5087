//! madvise(addr, len, advice): memory is always resident and never paged, so advice is
//! accepted and ignored, except MADV_DONTNEED, after which anonymous memory reads as zero.

use super::{Call, Errno, SyscallResult};
use crate::job;

const MADV_DONTNEED: u64 = 4;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, len, advice, ..] = call.args;
    if address % 4096 != 0 {
        return Err(Errno::EINVAL);
    }
    if advice == MADV_DONTNEED {
        job::with_process(|process| process.memory.discard(address, len));
    }
    Ok(0)
}
