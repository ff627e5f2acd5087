//! mprotect(addr, len, prot) on any mapped part of the job (image, stack, heap).

use super::{Call, Errno, SyscallResult};
use crate::arch::paging::Protection;
use crate::job;
use crate::job::memory::{Access, MemoryError};

const PROT_READ: u64 = 1;
const PROT_WRITE: u64 = 2;
const PROT_EXEC: u64 = 4;

/// PROT_* bits as page rights (x86 pages are always readable once present).
pub fn access_of(protection: u64) -> Result<Access, Errno> {
    if protection & !(PROT_READ | PROT_WRITE | PROT_EXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    Ok((protection != 0).then_some(Protection { write: protection & PROT_WRITE != 0, execute: protection & PROT_EXEC != 0 }))
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, len, protection, ..] = call.args;
    let access = access_of(protection)?;
    job::with_process(|process| process.memory.protect(address, len, access))
        .map(|_| 0)
        .map_err(|error| match error {
            MemoryError::NoMemory => Errno::ENOMEM,
            MemoryError::InvalidArgument => Errno::EINVAL,
        })
}
