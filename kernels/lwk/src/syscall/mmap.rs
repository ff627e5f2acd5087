//! mmap(addr, length, prot, flags, fd, offset): anonymous private or shared memory from the
//! job's heap (there are no files to map yet). The address is a hint except with MAP_FIXED
//! (or MAP_FIXED_NOREPLACE), which must fall inside the heap.

use super::{Call, Errno, SyscallResult};
use crate::job;
use crate::job::memory::MemoryError;

const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, len, protection, flags, _descriptor, offset] = call.args;
    if flags & MAP_ANONYMOUS == 0 {
        return Err(Errno::ENODEV);
    }
    if offset % 4096 != 0 {
        return Err(Errno::EINVAL);
    }
    let access = super::mprotect::access_of(protection)?;
    let fixed = (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0).then_some(address);
    job::with_process(|process| process.memory.map_anonymous(len, access, fixed)).map_err(|error| match error {
        MemoryError::NoMemory => Errno::ENOMEM,
        MemoryError::InvalidArgument => Errno::EINVAL,
    })
}
