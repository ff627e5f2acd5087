//! munmap(addr, len): the pages disappear; heap memory is cleared and reused by later
//! `mmap`s.

use super::{Call, Errno, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, len, ..] = call.args;
    job::with_process(|process| process.memory.unmap(address, len)).map(|_| 0).map_err(|_| Errno::EINVAL)
}
