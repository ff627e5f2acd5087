//! sysinfo(info): uptime, no load, the enclave's memory (RAM the kernel manages, free = what
//! is not reserved: the job's heap counts as used), one process.

use super::{user, Call, SyscallResult};
use crate::clock;
use crate::mm::pmem;
use crate::sched;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let mut info = [0u8; 112];
    let mut put = |offset: usize, bytes: &[u8]| info[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(0, &(clock::monotonic_ns() / 1_000_000_000).to_le_bytes()); // uptime
    put(32, &pmem::total_managed().to_le_bytes()); // totalram
    put(40, &pmem::total_free().to_le_bytes()); // freeram
    put(80, &(sched::thread_count() as u16).to_le_bytes()); // procs
    put(104, &1u32.to_le_bytes()); // mem_unit
    user::write_bytes(call.args[0], &info)?;
    Ok(0)
}
