//! What the job has used: getrusage, times, sysinfo. The job's time since it started counts
//! as user time (the kernel keeps no per-thread accounting; its own time is not counted);
//! there is no system time and no page fault (there is no paging); other fields are zero.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::mm::pmem;
use crate::{clock, job, sched};

const RUSAGE_SELF: i32 = 0;
const RUSAGE_CHILDREN: i32 = -1;
const RUSAGE_THREAD: i32 = 1;
const TICKS_PER_SECOND: u64 = 100;

/// getrusage(who, usage): RUSAGE_SELF, RUSAGE_THREAD (both the job's time), RUSAGE_CHILDREN
/// (zeros); others EINVAL.
pub fn getrusage(who: i32, usage: UserAddr) -> SyscallResult {
    let run_time = match who {
        RUSAGE_SELF | RUSAGE_THREAD => job::run_time_ns(),
        RUSAGE_CHILDREN => 0,
        _ => return Err(Errno::EINVAL),
    };
    let mut fields = [0u64; 18]; // two timevals, then fourteen longs
    fields[0] = run_time / 1_000_000_000;
    fields[1] = run_time % 1_000_000_000 / 1000;
    user::write_words(usage, &fields)?;
    Ok(0)
}

/// times(buf): the job's time in clock ticks (100 per second); returns ticks since boot.
pub fn times(buffer: UserAddr) -> SyscallResult {
    let ticks = |nanoseconds: u64| nanoseconds / (1_000_000_000 / TICKS_PER_SECOND);
    if let Some(buffer) = buffer.non_null() {
        user::write_words(buffer, &[ticks(job::run_time_ns()), 0, 0, 0])?;
    }
    Ok(ticks(clock::monotonic_ns()))
}

/// sysinfo(info): uptime, no load, the enclave's memory (RAM the kernel manages, free = what
/// is not reserved: the job's heap counts as used), its threads as processes.
pub fn sysinfo(info: UserAddr) -> SyscallResult {
    let mut fields = [0u8; 112];
    let mut put = |offset: usize, bytes: &[u8]| fields[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(0, &(clock::monotonic_ns() / 1_000_000_000).to_le_bytes()); // uptime
    put(32, &pmem::total_managed().to_le_bytes()); // totalram
    put(40, &pmem::total_free().to_le_bytes()); // freeram
    put(80, &(sched::thread_count() as u16).to_le_bytes()); // procs
    put(104, &1u32.to_le_bytes()); // mem_unit
    user::write_bytes(info, &fields)?;
    Ok(0)
}
