//! ppoll(fds, nfds, timeout, sigmask, sigsetsize): `poll` with a `struct timespec` timeout
//! (NULL: no limit) and, if `sigmask` is given, that signal mask while it waits (a signal that
//! ends the wait is handled under it, as after `rt_sigsuspend`).

use super::clock_nanosleep::read_duration;
use super::{user, Call, Errno, SyscallResult};
use crate::{clock, signal};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [fds, count, timeout, mask, set_size, ..] = call.args;
    let deadline = match timeout {
        0 => None,
        address => Some(clock::monotonic_ns().saturating_add(read_duration(address)?)),
    };
    if mask == 0 {
        return super::poll::wait_for_events(fds, count, deadline, false);
    }
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let [mask] = user::read_words::<1>(mask)?;
    // A signal the mask lets through may be pending already: it ends the call before any
    // wait, unless some descriptor is ready.
    signal::wait_under_mask(mask, |due| super::poll::wait_for_events(fds, count, deadline, due))
}
