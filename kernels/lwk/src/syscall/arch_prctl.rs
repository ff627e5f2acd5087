//! arch_prctl(code, addr): the calling thread's FS and GS bases (thread pointers for TLS).

use super::{user, Call, Errno, SyscallResult};
use crate::arch::cpu::{self, MSR_FS_BASE, MSR_GS_BASE};
use crate::arch::trap::USER_END;
use crate::sched;

const ARCH_SET_GS: u64 = 0x1001;
const ARCH_SET_FS: u64 = 0x1002;
const ARCH_GET_FS: u64 = 0x1003;
const ARCH_GET_GS: u64 = 0x1004;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [code, address, ..] = call.args;
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
        ARCH_GET_FS => user::write_words(address, &[cpu::read_msr(MSR_FS_BASE)]).map(|_| 0),
        ARCH_GET_GS => user::write_words(address, &[cpu::read_msr(MSR_GS_BASE)]).map(|_| 0),
        _ => Err(Errno::EINVAL),
    }
}
