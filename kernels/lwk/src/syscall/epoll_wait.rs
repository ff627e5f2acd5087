//! epoll_wait(epfd, events, maxevents, timeout): waits until some interest of the epoll
//! instance is due (`crate::job::epoll`), `timeout` ms pass (negative: no limit; 0: just look)
//! or a signal comes (EINTR once a handler ran, SA_RESTART or not, as on Linux; a signal no
//! handler takes restarts the call, where Linux may return EINTR); writes up to
//! `maxevents` `struct epoll_event`s (12 bytes each) and returns how many. As Linux:
//! `maxevents` <= 0 or above `INT_MAX / 12` is EINVAL; an `events` array reaching past the
//! user half EFAULT (checked first; an unwritable array only fails when there is something
//! to write); `epfd` not open EBADF, not an epoll instance EINVAL. Level-triggered interests
//! that were reported go to the end of the instance's list, so a small `maxevents` serves
//! every ready file in turn (Linux's ready list does the same); within one call events come
//! in the order the interests were added.

use super::poll::wait_until_ready;
use super::{user, Call, Errno, SyscallResult};
use crate::arch::trap::USER_END;
use crate::clock;
use crate::job::{self, descriptors::Descriptor};
use crate::signal::Restart;
use alloc::vec::Vec;

const EVENT_SIZE: u64 = 12;
const MAX_EVENTS: u64 = i32::MAX as u64 / EVENT_SIZE;

/// The common part of the `epoll_wait` calls, `deadline` in monotonic ns (`None`: no limit);
/// `interrupted`: a signal is due already (a due event still wins).
pub fn wait(epfd: u64, events: u64, max_events: u64, deadline: Option<u64>, interrupted: bool) -> SyscallResult {
    let max_events = max_events as i32;
    if max_events <= 0 || max_events as u64 > MAX_EVENTS {
        return Err(Errno::EINVAL);
    }
    if events.checked_add(max_events as u64 * EVENT_SIZE).is_none_or(|end| end > USER_END) {
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
        for (events, data) in &due {
            bytes.extend_from_slice(&events.to_le_bytes());
            bytes.extend_from_slice(&data.to_le_bytes());
        }
        if !bytes.is_empty() {
            user::write_bytes(events, &bytes)?;
        }
        return Ok(due.len() as u64);
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [epfd, events, max_events, timeout, ..] = call.args;
    let timeout = timeout as i32;
    let deadline = (timeout >= 0).then(|| clock::monotonic_ns().saturating_add(timeout as u64 * 1_000_000));
    wait(epfd, events, max_events, deadline, false)
}
