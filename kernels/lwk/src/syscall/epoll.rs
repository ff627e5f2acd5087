//! The epoll calls: epoll_create, epoll_create1, epoll_ctl and the epoll_wait family, over
//! `crate::job::epoll`.
//!
//! epoll_ctl(epfd, op, fd, event): EPOLL_CTL_ADD, EPOLL_CTL_MOD, EPOLL_CTL_DEL of an interest
//! in open file `fd` (`struct epoll_event`: u32 events, u64 data, packed in 12 bytes; not read
//! for DEL, which accepts NULL). Checked in Linux's order: the event's address (EFAULT), both
//! descriptors (EBADF), a target without a poll method (regular files, directories, host
//! files, `/dev/xpmem`: EPERM), `fd` naming the instance itself or `epfd` not an epoll
//! instance (EINVAL), EPOLLEXCLUSIVE misuse (with MOD, on an epoll target, or with bits outside
//! Linux's `EPOLLEXCLUSIVE_OK_BITS`: EINVAL), a nesting loop or depth (ELOOP), then the
//! operation (ADD of a present interest EEXIST; MOD or DEL of an absent one ENOENT; another op
//! EINVAL).
//!
//! Flags: EPOLLET (edge-triggered: reported once per change of the file that wakes Linux's
//! waiters: each write for a pipe's read end, a read that makes room in a full pipe for its
//! write end, an end closing for both, each signal for an XEMEM notify descriptor, a change of
//! any of its files for an epoll instance) and EPOLLONESHOT (reported once, then disabled
//! until MOD) are implemented; EPOLLEXCLUSIVE is accepted with ADD (it only spreads Linux's
//! wake-ups over several epoll instances); EPOLLWAKEUP is dropped, as Linux does for a caller
//! without CAP_BLOCK_SUSPEND; EPOLLRDHUP may be asked for and is never reported (Linux
//! reports it for sockets only).
//!
//! An epoll instance may watch another (readable while the inner one has an event due), as on
//! Linux: a cycle, or more than 4 instances nested below the added one, is ELOOP (Linux's
//! `ep_loop_check` also counts the levels above the instance added to: not here).

use super::poll::{timeout_deadline, wait_until_ready};
use super::time::deadline_after;
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::arch::trap::USER_END;
use crate::clock;
use crate::job::{self, descriptors::Descriptor, epoll};
use crate::linux::epoll_event;
use crate::linux_consts;
use crate::signal::{self, Restart};
use crate::{linux_field, linux_struct};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::mem::size_of;

linux_consts!(i32: EPOLL_CLOEXEC, EPOLL_CTL_ADD, EPOLL_CTL_DEL, EPOLL_CTL_MOD);
const EVENT_SIZE: u64 = size_of::<epoll_event>() as u64;
const MAX_EVENTS: u64 = i32::MAX as u64 / EVENT_SIZE;

/// epoll_create(size): `epoll_create1(0)`; `size` is only checked (> 0, else EINVAL), as on
/// Linux.
pub fn epoll_create(size: i32) -> SyscallResult {
    if size <= 0 {
        return Err(Errno::EINVAL);
    }
    create(false)
}

/// epoll_create1(flags): a new epoll instance (`crate::job::epoll`) on the lowest free
/// descriptor. Flags: EPOLL_CLOEXEC; others EINVAL. EMFILE when the table is full.
pub fn epoll_create1(flags: i32) -> SyscallResult {
    if flags & !EPOLL_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    create(flags & EPOLL_CLOEXEC != 0)
}

fn create(close_on_exec: bool) -> SyscallResult {
    let epoll = Arc::new(epoll::Epoll::new());
    job::with_process(|process| process.descriptors.insert_flagged(Descriptor::Epoll(epoll), close_on_exec))
        .map(u64::from)
        .ok_or(Errno::EMFILE)
}

/// epoll_ctl: see the module documentation.
pub fn epoll_ctl(epfd: Fd, op: i32, fd: Fd, event: UserAddr) -> SyscallResult {
    let fd_number = fd.0 as u32;
    let (mut events, data) = if op != EPOLL_CTL_DEL {
        let mut bytes = [0u8; size_of::<epoll_event>()];
        user::read_into(event, &mut bytes)?;
        (linux_field!(&bytes, epoll_event, events), linux_field!(&bytes, epoll_event, data))
    } else {
        (0, 0)
    };
    let (instance_file, file, watch) = job::with_process(|process| {
        let instance_file = process.descriptors.open_file(epfd).ok_or(Errno::EBADF)?;
        let file = process.descriptors.open_file(fd).ok_or(Errno::EBADF)?;
        let (watch, can_watch) = {
            let target = file.lock();
            (epoll::Watch::of(&target), epoll::can_watch(&target))
        };
        if !can_watch {
            return Err(Errno::EPERM);
        }
        Ok((instance_file, file, watch))
    })?;
    events &= !epoll::EPOLLWAKEUP;
    // Not the epoll instance itself (whatever descriptor names it).
    let instance = match &*instance_file.lock() {
        Descriptor::Epoll(instance) if !Arc::ptr_eq(&instance_file, &file) => instance.clone(),
        _ => return Err(Errno::EINVAL),
    };
    drop(instance_file);
    let exclusive = events & epoll::EPOLLEXCLUSIVE != 0;
    if exclusive
        && (op == EPOLL_CTL_MOD
            || (op == EPOLL_CTL_ADD && (events & !epoll::EXCLUSIVE_OK_BITS != 0 || matches!(watch, epoll::Watch::Epoll(_)))))
    {
        return Err(Errno::EINVAL);
    }
    let result = match (op, &watch) {
        (EPOLL_CTL_ADD, epoll::Watch::Epoll(inner)) => {
            let _nesting = epoll::NESTING.lock();
            inner.check_nesting(&instance, 1).and_then(|()| instance.add(fd_number, &file, watch.clone(), events, data))
        }
        (EPOLL_CTL_ADD, _) => instance.add(fd_number, &file, watch, events, data),
        (EPOLL_CTL_MOD, _) => instance.modify(fd_number, &file, events, data),
        (EPOLL_CTL_DEL, _) => instance.remove(fd_number, &file),
        _ => Err(Errno::EINVAL),
    };
    // `file` may be the last handle on the open file now (another thread closed it): it goes
    // here, with no lock held.
    drop(file);
    result.map(|()| 0)
}

/// epoll_wait(epfd, events, maxevents, timeout): waits until some interest of the epoll
/// instance is due (`crate::job::epoll`), `timeout` ms pass (negative: no limit; 0: just look)
/// or a signal comes (EINTR once a handler ran, SA_RESTART or not, as on Linux; a signal no
/// handler takes restarts the call, where Linux may return EINTR); writes up to
/// `maxevents` `struct epoll_event`s (12 bytes each) and returns how many. As Linux:
/// `maxevents` <= 0 or above `INT_MAX / 12` is EINVAL; an `events` array reaching past the
/// user half EFAULT (checked first; an unwritable array only fails when there is something
/// to write); `epfd` not open EBADF, not an epoll instance EINVAL. Level-triggered interests
/// that were reported go to the end of the instance's list, so a small `maxevents` serves
/// every ready file in turn (Linux's ready list does the same); within one call events come
/// in the order the interests were added.
pub fn epoll_wait(epfd: Fd, events: UserAddr, max_events: i32, timeout: i32) -> SyscallResult {
    wait(epfd, events, max_events, timeout_deadline(timeout), false)
}

/// epoll_pwait(epfd, events, maxevents, timeout, sigmask, sigsetsize): `epoll_wait` under
/// signal mask `sigmask` if given (`sigsetsize` must then be 8, else EINVAL, checked first as
/// on Linux): a signal it lets through ends the wait with EINTR and its handler runs under
/// that mask, as `ppoll`'s.
pub fn epoll_pwait(epfd: Fd, events: UserAddr, max_events: i32, timeout: i32, mask: UserAddr, set_size: usize) -> SyscallResult {
    wait_with_mask(epfd, events, max_events, timeout_deadline(timeout), mask, set_size)
}

/// epoll_pwait2(epfd, events, maxevents, timeout, sigmask, sigsetsize): `epoll_pwait` with a
/// `struct timespec` timeout (NULL: no limit; nanoseconds outside 0..10^9 or negative seconds
/// EINVAL, checked before anything else, as on Linux).
pub fn epoll_pwait2(epfd: Fd, events: UserAddr, max_events: i32, timeout: UserAddr, mask: UserAddr, set_size: usize) -> SyscallResult {
    let deadline = deadline_after(timeout)?;
    wait_with_mask(epfd, events, max_events, deadline, mask, set_size)
}

/// `epoll_wait` under the mask at user address `mask` (NULL: the thread's own).
fn wait_with_mask(epfd: Fd, events: UserAddr, max_events: i32, deadline: Option<u64>, mask: UserAddr, set_size: usize) -> SyscallResult {
    if mask.is_null() {
        return wait(epfd, events, max_events, deadline, false);
    }
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let [mask] = user::read_words::<1>(mask)?;
    signal::wait_under_mask(mask, |due| wait(epfd, events, max_events, deadline, due))
}

/// The common part of the `epoll_wait` calls, `deadline` in monotonic ns (`None`: no limit);
/// `interrupted`: a signal is due already (a due event still wins).
fn wait(epfd: Fd, events: UserAddr, max_events: i32, deadline: Option<u64>, interrupted: bool) -> SyscallResult {
    if max_events <= 0 || max_events as u64 > MAX_EVENTS {
        return Err(Errno::EINVAL);
    }
    if events.0.checked_add(max_events as u64 * EVENT_SIZE).is_none_or(|end| end > USER_END) {
        return Err(Errno::EFAULT);
    }
    let instance = job::with_process(|process| match process.descriptors.get(epfd).as_deref() {
        None => Err(Errno::EBADF),
        Some(Descriptor::Epoll(instance)) => Ok(instance.clone()),
        Some(_) => Err(Errno::EINVAL),
    })?;
    loop {
        if wait_until_ready(deadline, interrupted, || instance.has_ready()).is_err() {
            return Err(Restart::NoHandler.errno());
        }
        // Another thread may have taken what woke this one: wait again, unless time is up.
        let due = instance.collect(max_events as usize);
        if due.is_empty() && deadline.is_none_or(|deadline| clock::monotonic_ns() < deadline) {
            continue;
        }
        let mut bytes = Vec::with_capacity(due.len() * EVENT_SIZE as usize);
        for &(events, data) in &due {
            bytes.extend_from_slice(&linux_struct!(epoll_event { events: events, data: data }));
        }
        if !bytes.is_empty() {
            user::write_bytes(events, &bytes)?;
        }
        return Ok(due.len() as u64);
    }
}
