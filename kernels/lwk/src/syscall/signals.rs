//! The signal calls: rt_sigaction, rt_sigprocmask, rt_sigreturn, rt_sigpending,
//! rt_sigsuspend, rt_sigtimedwait, sigaltstack, pause; delivery is `crate::signal`'s. Every
//! signal set is one 64-bit word: a `sigsetsize` other than 8 is EINVAL (rt_sigpending takes
//! up to 8), as on Linux.

use super::time::deadline_after;
use super::{user, Errno, SyscallResult, UserAddr};
use crate::arch::trap::TrapFrame;
use crate::linux::{kernel_sigaction, sigaltstack};
use crate::linux_consts;
use crate::sched;
use crate::signal::{self, Action, AltStackError, AwaitError, Restart, SIGKILL, SIGSTOP};
use crate::{linux_field, linux_struct};
use core::mem::size_of;

linux_consts!(i32: SIG_BLOCK, SIG_UNBLOCK, SIG_SETMASK);
const SIGSET_SIZE: usize = 8;

/// rt_sigaction(sig, act, oldact, sigsetsize): records the action (handler, flags, restorer,
/// mask) that `crate::signal` uses to deliver `sig`; SIGKILL and SIGSTOP cannot be caught.
pub fn rt_sigaction(signal: i32, action: UserAddr, old_action: UserAddr, set_size: usize) -> SyscallResult {
    if !(1..=64).contains(&signal) || set_size != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let signal = signal as u8;
    let requested = match action.non_null() {
        None => None,
        Some(address) => {
            let mut bytes = [0u8; size_of::<kernel_sigaction>()];
            user::read_into(address, &mut bytes)?;
            let (handler, flags, restorer, mask) = (
                linux_field!(&bytes, kernel_sigaction, sa_handler_kernel),
                linux_field!(&bytes, kernel_sigaction, sa_flags),
                linux_field!(&bytes, kernel_sigaction, sa_restorer),
                linux_field!(&bytes, kernel_sigaction, sa_mask),
            );
            if signal == SIGKILL || signal == SIGSTOP {
                return Err(Errno::EINVAL);
            }
            Some(Action { handler, flags, restorer, mask })
        }
    };
    let old = match requested {
        Some(action) => signal::set_action(signal, action),
        None => signal::action(signal),
    };
    if let Some(old_action) = old_action.non_null() {
        let record = linux_struct!(kernel_sigaction {
            sa_handler_kernel: old.handler,
            sa_flags: old.flags,
            sa_restorer: old.restorer,
            sa_mask: old.mask,
        });
        user::write_bytes(old_action, &record)?;
    }
    Ok(0)
}

/// rt_sigprocmask(how, set, oldset, sigsetsize): the calling thread's mask. A signal that
/// becomes unblocked while pending is delivered as the call returns.
pub fn rt_sigprocmask(how: i32, set: UserAddr, old_set: UserAddr, set_size: usize) -> SyscallResult {
    if set_size != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let old = if let Some(set) = set.non_null() {
        let [requested] = user::read_words::<1>(set)?;
        let change: fn(u64, u64) -> u64 = match how {
            SIG_BLOCK => |old, requested| old | requested,
            SIG_UNBLOCK => |old, requested| old & !requested,
            SIG_SETMASK => |_, requested| requested,
            _ => return Err(Errno::EINVAL),
        };
        signal::change_mask(|old| change(old, requested))
    } else {
        signal::change_mask(|old| old)
    };
    if let Some(old_set) = old_set.non_null() {
        user::write_words(old_set, &[old])?;
    }
    Ok(0)
}

/// rt_sigreturn(): a signal handler returned through its restorer; the interrupted context
/// comes back from the frame `crate::signal` built.
pub fn rt_sigreturn(frame: &mut TrapFrame) -> SyscallResult {
    Ok(signal::return_from_handler(frame))
}

/// rt_sigpending(set, sigsetsize): the signals pending for the calling thread or the process.
pub fn rt_sigpending(set: UserAddr, set_size: usize) -> SyscallResult {
    if set_size > SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let pending = signal::pending().to_le_bytes();
    user::write_bytes(set, &pending[..set_size])?;
    Ok(0)
}

/// rt_sigsuspend(mask, sigsetsize): waits with `mask` as the thread's mask until a signal it
/// then takes arrives; returns EINTR once the handler has run, with the old mask back.
pub fn rt_sigsuspend(mask: UserAddr, set_size: usize) -> SyscallResult {
    if set_size != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let [mask] = user::read_words::<1>(mask)?;
    Err(signal::suspend(mask).errno())
}

/// rt_sigtimedwait(set, info, timeout, sigsetsize): takes a pending signal of `set` without
/// running its handler, waiting for one up to the relative `timeout` (NULL: no limit; zero:
/// just look). Returns the signal and fills `info` (if given) as Linux does; EAGAIN when the
/// time runs out, EINTR when another signal, whose handler runs, comes first.
pub fn rt_sigtimedwait(set: UserAddr, info: UserAddr, timeout: UserAddr, set_size: usize) -> SyscallResult {
    if set_size != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let [set] = user::read_words::<1>(set)?;
    let deadline = deadline_after(timeout)?;
    let head = signal::await_signal(set, deadline).map_err(|error| match error {
        AwaitError::TimedOut => Errno::EAGAIN,
        AwaitError::Interrupted => Errno::EINTR,
    })?;
    if let Some(info) = info.non_null() {
        let mut words = [0u64; 16];
        words[..3].copy_from_slice(&head);
        user::write_words(info, &words)?;
    }
    Ok(head[0])
}

/// sigaltstack(ss, old_ss): the calling thread's alternate signal stack (`stack_t`: base,
/// flags, size), used by handlers installed with SA_ONSTACK. Whether the caller runs on that
/// stack depends on its stack pointer, hence the full frame.
pub fn sigaltstack(frame: &mut TrapFrame, stack: UserAddr, old_stack: UserAddr) -> SyscallResult {
    let new = match stack.non_null() {
        None => None,
        Some(address) => {
            let mut bytes = [0u8; size_of::<sigaltstack>()];
            user::read_into(address, &mut bytes)?;
            let flags: u32 = linux_field!(&bytes, sigaltstack, ss_flags);
            Some((linux_field!(&bytes, sigaltstack, ss_sp), flags as u64, linux_field!(&bytes, sigaltstack, ss_size)))
        }
    };
    let old = signal::alt_stack(new, frame.rsp).map_err(|error| match error {
        AltStackError::OnStack => Errno::EPERM,
        AltStackError::TooSmall => Errno::ENOMEM,
        AltStackError::BadFlags => Errno::EINVAL,
    })?;
    if let Some(old_stack) = old_stack.non_null() {
        let record = linux_struct!(sigaltstack { ss_sp: old.0, ss_flags: old.1 as u32, ss_size: old.2 });
        user::write_bytes(old_stack, &record)?;
    }
    Ok(0)
}

/// pause(): waits until a signal the thread takes arrives; returns EINTR once its handler
/// has run (a signal whose action is to ignore it does not wake the thread).
pub fn pause() -> SyscallResult {
    sched::wait_for_signal();
    Err(Restart::NoHandler.errno())
}
