//! epoll_pwait(epfd, events, maxevents, timeout, sigmask, sigsetsize): `epoll_wait` under
//! signal mask `sigmask` if given (`sigsetsize` must then be 8, else EINVAL, checked first as
//! on Linux): a signal it lets through ends the wait with EINTR and its handler runs under
//! that mask, as `ppoll`'s.

use super::{user, Call, Errno, SyscallResult};
use crate::{clock, signal};

/// `epoll_wait` under the mask at user address `mask` (0: the thread's own).
pub fn wait_with_mask(epfd: u64, events: u64, max_events: u64, deadline: Option<u64>, mask: u64, set_size: u64) -> SyscallResult {
    if mask == 0 {
        return super::epoll_wait::wait(epfd, events, max_events, deadline, false);
    }
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let [mask] = user::read_words::<1>(mask)?;
    signal::wait_under_mask(mask, |due| super::epoll_wait::wait(epfd, events, max_events, deadline, due))
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [epfd, events, max_events, timeout, mask, set_size] = call.args;
    let timeout = timeout as i32;
    let deadline = (timeout >= 0).then(|| clock::monotonic_ns().saturating_add(timeout as u64 * 1_000_000));
    wait_with_mask(epfd, events, max_events, deadline, mask, set_size)
}
