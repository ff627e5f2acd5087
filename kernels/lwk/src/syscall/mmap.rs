//! mmap(addr, length, prot, flags, fd, offset): memory from the job's heap. Anonymous
//! mappings, private or shared, start zeroed; file mappings (private, or shared read-only:
//! files cannot change) are filled with a copy of the file at `offset` (zero past its end).
//! The address is a hint except with MAP_FIXED (or MAP_FIXED_NOREPLACE), which must fall
//! inside the heap.

use super::{Call, Errno, SyscallResult};
use crate::job::descriptors::Descriptor;
use crate::job::memory::{MemoryError, READ_WRITE};
use crate::job::{self, Process};

const PROT_WRITE: u64 = 2;
const MAP_SHARED: u64 = 0x01;
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;

fn memory_error(error: MemoryError) -> Errno {
    match error {
        MemoryError::NoMemory => Errno::ENOMEM,
        MemoryError::InvalidArgument => Errno::EINVAL,
    }
}

fn map_file(process: &mut Process, descriptor: u64, len: u64, protection: u64, flags: u64, offset: u64, fixed: Option<u64>) -> SyscallResult {
    let node = match process.descriptors.get(descriptor).as_deref_mut() {
        Some(Descriptor::File { node, .. }) => *node,
        Some(_) => return Err(Errno::ENODEV),
        None => return Err(Errno::EBADF),
    };
    if flags & MAP_SHARED != 0 && protection & PROT_WRITE != 0 {
        return Err(Errno(13)); // EACCES: the file is open read-only
    }
    let access = super::mprotect::access_of(protection)?;
    let start = process.memory.map_anonymous(len, Some(READ_WRITE), fixed).map_err(memory_error)?;
    let contents = node.contents();
    let from = (offset as usize).min(contents.len());
    let count = (len as usize).min(contents.len() - from);
    process.memory.fill_heap(start, &contents[from..from + count]);
    if access != Some(READ_WRITE) {
        process.memory.protect(start, len, access).map_err(memory_error)?;
    }
    Ok(start)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, len, protection, flags, descriptor, offset] = call.args;
    if offset % 4096 != 0 {
        return Err(Errno::EINVAL);
    }
    let fixed = (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0).then_some(address);
    if flags & MAP_ANONYMOUS == 0 {
        return job::with_process(|process| map_file(process, descriptor, len, protection, flags, offset, fixed));
    }
    let access = super::mprotect::access_of(protection)?;
    job::with_process(|process| process.memory.map_anonymous(len, access, fixed)).map_err(memory_error)
}
