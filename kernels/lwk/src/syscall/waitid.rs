//! waitid(idtype, id, info, options, rusage): P_ALL, P_PID, P_PGID; WEXITED is required,
//! WNOHANG and WNOWAIT (leave the child waitable) honoured. The siginfo says SIGCHLD,
//! CLD_EXITED or CLD_KILLED, the child's pid and status; with WNOHANG and no ended child it
//! is cleared (si_pid 0).

use super::wait4::WNOHANG;
use super::{user, Call, Errno, SyscallResult};
use crate::process::{self, Selector, Waited, SIGCHLD};

const P_ALL: u64 = 0;
const P_PID: u64 = 1;
const P_PGID: u64 = 2;
const WEXITED: u64 = 4;
const WNOWAIT: u64 = 0x0100_0000;
const CLD_EXITED: i32 = 1;
const CLD_KILLED: i32 = 2;
const SIGINFO_SIZE: usize = 128;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [id_type, id, info, options, rusage, ..] = call.args;
    if options & WEXITED == 0 || options & !(WEXITED | WNOHANG | WNOWAIT | 2 | 8) != 0 {
        return Err(Errno::EINVAL);
    }
    let selector = match id_type {
        P_ALL => Selector::Any,
        P_PID if id as i32 > 0 => Selector::Pid(id as u32 as u64),
        P_PGID => Selector::Group(id as u32 as u64),
        _ => return Err(Errno::EINVAL),
    };
    let mut siginfo = [0u8; SIGINFO_SIZE];
    if let Waited::Ended(child, status) = process::wait_for_child(selector, options & WNOHANG != 0, options & WNOWAIT != 0)? {
        let (code, value) = match status & 0x7f {
            0 => (CLD_EXITED, (status >> 8) & 0xff),
            signal => (CLD_KILLED, signal),
        };
        siginfo[0..4].copy_from_slice(&(SIGCHLD as i32).to_le_bytes());
        siginfo[8..12].copy_from_slice(&code.to_le_bytes());
        siginfo[16..20].copy_from_slice(&(child as u32).to_le_bytes());
        siginfo[24..28].copy_from_slice(&value.to_le_bytes());
    }
    if info != 0 {
        user::write_bytes(info, &siginfo)?;
    }
    if rusage != 0 {
        user::write_bytes(rusage, &[0; 144])?;
    }
    Ok(0)
}
