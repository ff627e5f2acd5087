//! clone, fork, vfork.
//!
//! clone(flags, stack, parent_tid, child_tid, tls): threads (CLONE_VM | CLONE_THREAD, what
//! pthread_create asks for) and processes (no CLONE_VM: fork; CLONE_VM | CLONE_VFORK:
//! vfork and posix_spawn). The child starts where the parent returns, with the parent's
//! registers, RAX = 0 and the given stack (the parent's stack pointer when 0, for a process).
//! A process child gets a copy of the caller's memory (`crate::process::fork`), so a vfork
//! child cannot change its parent's memory; its parent still waits for its exec or exit.
//! The termination signal in the low byte is SIGCHLD for every process child.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::arch::trap::TrapFrame;
use crate::console::log;
use crate::linux::uapi;
use crate::linux_consts;
use crate::process::{self, ForkError};
use crate::sched::{self, SpawnError};

linux_consts!(u64: CLONE_VM, CLONE_VFORK, CLONE_THREAD, CLONE_SETTLS, CLONE_PARENT_SETTID, CLONE_CHILD_CLEARTID, CLONE_CHILD_SETTID);
const SIGNAL_MASK: u64 = 0xff;
/// The flags a process child may carry besides CLONE_VM | CLONE_VFORK and the tid ones.
const PROCESS_FLAGS: u64 =
    SIGNAL_MASK | CLONE_VM | CLONE_VFORK | CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID | CLONE_CHILD_SETTID;

const SIGCHLD: u64 = uapi::SIGCHLD as u64;

/// A new process (fork/vfork); `flags` as `clone`'s.
fn new_process(frame: &TrapFrame, flags: u64, stack: u64, parent_tid: UserAddr, child_tid: UserAddr, tls: u64) -> SyscallResult {
    if flags & CLONE_VM != 0 && flags & CLONE_VFORK == 0 {
        log!("clone with CLONE_VM but neither CLONE_THREAD nor CLONE_VFORK (flags {flags:#x}) is not supported");
        return Err(Errno::EINVAL);
    }
    let fs_base = if flags & CLONE_SETTLS != 0 { tls } else { sched::current_fs_base() };
    let set_child_tid = (flags & CLONE_CHILD_SETTID != 0).then_some(child_tid.0);
    let clear_child_tid = if flags & CLONE_CHILD_CLEARTID != 0 { child_tid.0 } else { 0 };
    let pid =
        process::fork(frame, stack, fs_base, set_child_tid, clear_child_tid, flags & CLONE_VFORK != 0).map_err(|error| match error {
            ForkError::NoMemory => Errno::ENOMEM,
            ForkError::TooManyThreads => Errno::EAGAIN,
        })?;
    if flags & CLONE_PARENT_SETTID != 0 {
        user::write_bytes(parent_tid, &(pid as u32).to_le_bytes())?;
    }
    Ok(pid)
}

pub fn clone(frame: &mut TrapFrame, flags: u64, stack: u64, parent_tid: UserAddr, child_tid: UserAddr, tls: u64) -> SyscallResult {
    if flags & CLONE_THREAD == 0 {
        if flags & !PROCESS_FLAGS != 0 {
            log!("clone of a process with flags {flags:#x} is not supported");
            return Err(Errno::EINVAL);
        }
        return new_process(frame, flags, stack, parent_tid, child_tid, tls);
    }
    if flags & CLONE_VM == 0 {
        log!("clone of a thread without CLONE_VM (flags {flags:#x}) is not supported");
        return Err(Errno::EINVAL);
    }
    if stack == 0 {
        return Err(Errno::EINVAL);
    }
    let mut child = *frame;
    child.rax = 0;
    child.rsp = stack;
    let fs_base = if flags & CLONE_SETTLS != 0 { tls } else { sched::current_fs_base() };
    let clear_child_tid = if flags & CLONE_CHILD_CLEARTID != 0 { child_tid.0 } else { 0 };
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

/// fork(): `clone(SIGCHLD)`, a new process with a copy of the caller's memory (musl calls it).
pub fn fork(frame: &mut TrapFrame) -> SyscallResult {
    new_process(frame, SIGCHLD, 0, UserAddr(0), UserAddr(0), 0)
}

/// vfork(): `clone(CLONE_VM | CLONE_VFORK | SIGCHLD)`: the child gets a copy of the caller's
/// memory and the caller waits until the child executes a new image or ends.
pub fn vfork(frame: &mut TrapFrame) -> SyscallResult {
    new_process(frame, CLONE_VM | CLONE_VFORK | SIGCHLD, 0, UserAddr(0), UserAddr(0), 0)
}
