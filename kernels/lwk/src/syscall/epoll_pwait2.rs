//! epoll_pwait2(epfd, events, maxevents, timeout, sigmask, sigsetsize): `epoll_pwait` with a
//! `struct timespec` timeout (NULL: no limit; nanoseconds outside 0..10^9 or negative seconds
//! EINVAL, checked before anything else, as on Linux).

use super::clock_nanosleep::read_duration;
use super::{Call, SyscallResult};
use crate::clock;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [epfd, events, max_events, timeout, mask, set_size] = call.args;
    let deadline = match timeout {
        0 => None,
        address => Some(clock::monotonic_ns().saturating_add(read_duration(address)?)),
    };
    super::epoll_pwait::wait_with_mask(epfd, events, max_events, deadline, mask, set_size)
}
