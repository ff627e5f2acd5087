//! The calling thread's own settings: its thread pointers (arch_prctl), the word cleared when
//! it exits (set_tid_address) and its robust futex list (set_robust_list).

use super::{user, Errno, SyscallResult, UserAddr};
use crate::arch::cpu::{self, MSR_FS_BASE, MSR_GS_BASE};
use crate::arch::trap::USER_END;
use crate::linux::uapi;
use crate::sched;

const ARCH_SET_GS: i32 = 0x1001;
const ARCH_SET_FS: i32 = uapi::ARCH_SET_FS as i32;
const ARCH_GET_FS: i32 = 0x1003;
const ARCH_GET_GS: i32 = 0x1004;

/// sizeof(struct robust_list_head) on x86-64.
const ROBUST_LIST_HEAD_SIZE: usize = 24;

/// arch_prctl(code, addr): the calling thread's FS and GS bases (thread pointers for TLS).
/// `addr` is the base itself for the SET codes, where to write it for the GET codes.
pub fn arch_prctl(code: i32, address: u64) -> SyscallResult {
    match code {
        ARCH_SET_FS | ARCH_SET_GS if address >= USER_END => Err(Errno::EPERM),
        ARCH_SET_FS => {
            sched::set_fs_base(address);
            Ok(0)
        }
        ARCH_SET_GS => {
            sched::set_gs_base(address);
            Ok(0)
        }
        ARCH_GET_FS => user::write_words(UserAddr(address), &[cpu::read_msr(MSR_FS_BASE)]).map(|_| 0),
        ARCH_GET_GS => user::write_words(UserAddr(address), &[cpu::read_msr(MSR_GS_BASE)]).map(|_| 0),
        _ => Err(Errno::EINVAL),
    }
}

/// set_tid_address(tidptr): the word zeroed and woken when the calling thread exits; returns
/// the caller's thread id.
pub fn set_tid_address(address: u64) -> SyscallResult {
    sched::set_clear_child_tid(address);
    Ok(sched::current_tid())
}

/// set_robust_list(head, len): accepted (the list matters only when a thread dies holding a
/// lock, and the job's threads all end together).
pub fn set_robust_list(_head: UserAddr, len: usize) -> SyscallResult {
    if len != ROBUST_LIST_HEAD_SIZE {
        return Err(Errno::EINVAL);
    }
    Ok(0)
}
