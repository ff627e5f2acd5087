//! clone(flags, stack, parent_tid, child_tid, tls): threads only (CLONE_VM | CLONE_THREAD),
//! which is what pthread_create asks for. The child starts where the parent returns, with the
//! parent's registers, RAX = 0 and the given stack. Processes (fork, vfork, posix_spawn
//! without CLONE_VM) are not supported: the job is one process.

use super::{user, Call, Errno, SyscallResult};
use crate::console::log;
use crate::sched::{self, SpawnError};

const CLONE_VM: u64 = 0x100;
const CLONE_SETTLS: u64 = 0x8_0000;
const CLONE_PARENT_SETTID: u64 = 0x10_0000;
const CLONE_CHILD_CLEARTID: u64 = 0x20_0000;
const CLONE_CHILD_SETTID: u64 = 0x100_0000;
const CLONE_THREAD: u64 = 0x1_0000;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [flags, stack, parent_tid, child_tid, tls, _] = call.args;
    let frame = call.frame.as_deref().ok_or(Errno::ENOSYS)?;
    if flags & (CLONE_VM | CLONE_THREAD) != CLONE_VM | CLONE_THREAD {
        log!("clone without CLONE_VM | CLONE_THREAD (a new process, flags {flags:#x}) is not supported");
        return Err(Errno::ENOSYS);
    }
    if stack == 0 {
        return Err(Errno::EINVAL);
    }
    let mut child = *frame;
    child.rax = 0;
    child.rsp = stack;
    let fs_base = if flags & CLONE_SETTLS != 0 { tls } else { sched::current_fs_base() };
    let clear_child_tid = if flags & CLONE_CHILD_CLEARTID != 0 { child_tid } else { 0 };
    let tid = sched::spawn(&child, fs_base, clear_child_tid).map_err(|error| match error {
        SpawnError::TooManyThreads => Errno::EAGAIN,
        SpawnError::NoMemory => Errno::ENOMEM,
    })?;
    crate::signal::thread_created(sched::current_tid(), tid);
    let tid_bytes = (tid as u32).to_le_bytes();
    if flags & CLONE_PARENT_SETTID != 0 {
        user::write_bytes(parent_tid, &tid_bytes)?;
    }
    if flags & CLONE_CHILD_SETTID != 0 {
        user::write_bytes(child_tid, &tid_bytes)?;
    }
    Ok(tid)
}
