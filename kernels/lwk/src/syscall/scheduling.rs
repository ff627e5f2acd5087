//! The scheduler's calls: sched_yield, sched_setaffinity, sched_getaffinity, getcpu. CPUs
//! beyond the first 64 do not exist here: a CPU mask is one 64-bit word.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::arch::tables;
use crate::sched::{self, AffinityError};

/// sched_yield(): the next runnable thread of the job runs, if there is one.
pub fn sched_yield() -> SyscallResult {
    sched::yield_now();
    Ok(0)
}

/// sched_setaffinity(tid, len, mask): the thread runs on the CPUs of `mask` only, moved to the
/// least busy online one unless it already runs on a CPU of the mask. A mask without an
/// online CPU is EINVAL; another process's tid is ESRCH.
pub fn sched_setaffinity(tid: i32, len: usize, mask: UserAddr) -> SyscallResult {
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    // Only the first word matters.
    let bytes = user::read_bytes(mask, len.min(8))?;
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(&bytes);
    let tid = if tid == 0 { sched::current_tid() } else { tid as u64 };
    sched::set_affinity(tid, u64::from_le_bytes(word)).map(|_| 0).map_err(|error| match error {
        AffinityError::NoSuchThread => Errno::ESRCH,
        AffinityError::NoOnlineCpu => Errno::EINVAL,
    })
}

/// sched_getaffinity(pid, len, mask): the CPUs of the job's enclave (every thread may be
/// placed on any of them). Returns the bytes written, as the raw system call does.
pub fn sched_getaffinity(_pid: i32, len: usize, mask: UserAddr) -> SyscallResult {
    if len < 8 || !len.is_multiple_of(8) {
        return Err(Errno::EINVAL);
    }
    user::write_words(mask, &[sched::online_cpu_mask()])?;
    Ok(8)
}

/// getcpu(cpu, node, cache): the CPU the caller runs on (one NUMA node, 0).
pub fn getcpu(cpu: UserAddr, node: UserAddr) -> SyscallResult {
    if let Some(cpu) = cpu.non_null() {
        user::write_bytes(cpu, &(tables::current_cpu() as u32).to_le_bytes())?;
    }
    if let Some(node) = node.non_null() {
        user::write_bytes(node, &0u32.to_le_bytes())?;
    }
    Ok(0)
}
