//! What the job has used: getrusage, times, sysinfo. The job's time since it started counts
//! as a process's user time, a thread's own time on a CPU (kernel time included) as the
//! thread's; there is no system time and no page fault (there is no paging); other fields
//! are zero.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::linux::{rusage, sysinfo, TMS_SIZE};
use crate::linux_consts;
use crate::linux_struct;
use crate::mm::pmem;
use crate::{clock, job, sched};

linux_consts!(i32: RUSAGE_SELF, RUSAGE_CHILDREN, RUSAGE_THREAD);
const TICKS_PER_SECOND: u64 = 100;

/// getrusage(who, usage): RUSAGE_SELF (the job's time), RUSAGE_THREAD (the thread's),
/// RUSAGE_CHILDREN (zeros); others EINVAL.
pub fn getrusage(who: i32, usage: UserAddr) -> SyscallResult {
    let run_time = match who {
        RUSAGE_SELF => job::run_time_ns(),
        RUSAGE_THREAD => super::time::current_thread_time(),
        RUSAGE_CHILDREN => 0,
        _ => return Err(Errno::EINVAL),
    };
    let (seconds, micros) = ((run_time / 1_000_000_000) as i64, (run_time % 1_000_000_000 / 1000) as i64);
    user::write_bytes(usage, &linux_struct!(rusage { ru_utime.tv_sec: seconds, ru_utime.tv_usec: micros }))?;
    Ok(0)
}

/// times(buf): the job's time in clock ticks (100 per second); returns ticks since boot.
pub fn times(buffer: UserAddr) -> SyscallResult {
    let ticks = |nanoseconds: u64| nanoseconds / (1_000_000_000 / TICKS_PER_SECOND);
    if let Some(buffer) = buffer.non_null() {
        // tms_utime, then the system and children's times (zero).
        let mut tms = [0u8; TMS_SIZE];
        tms[..8].copy_from_slice(&ticks(job::run_time_ns()).to_le_bytes());
        user::write_bytes(buffer, &tms)?;
    }
    Ok(ticks(clock::monotonic_ns()))
}

/// sysinfo(info): uptime, no load, the enclave's memory (RAM the kernel manages, free = what
/// is not reserved: the job's heap counts as used), its threads as processes.
pub fn sysinfo(info: UserAddr) -> SyscallResult {
    let record = linux_struct!(sysinfo {
        uptime: (clock::monotonic_ns() / 1_000_000_000) as i64,
        totalram: pmem::total_managed(),
        freeram: pmem::total_free(),
        procs: sched::thread_count() as u16,
        mem_unit: 1u32,
    });
    user::write_bytes(info, &record)?;
    Ok(0)
}
