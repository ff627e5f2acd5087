//! rt_sigtimedwait(set, info, timeout, sigsetsize): takes a pending signal of `set` without
//! running its handler, waiting for one up to the relative `timeout` (none: no limit; zero:
//! just look). Returns the signal and fills `info` (if given) as Linux does; EAGAIN when the
//! time runs out, EINTR when another signal, whose handler runs, comes first.

use super::clock_nanosleep::read_duration;
use super::{user, Call, Errno, SyscallResult};
use crate::clock;
use crate::signal::{self, AwaitError};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [set, info, timeout, set_size, ..] = call.args;
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let [set] = user::read_words::<1>(set)?;
    let deadline = match timeout {
        0 => None,
        address => Some(clock::monotonic_ns().saturating_add(read_duration(address)?)),
    };
    let head = signal::await_signal(set, deadline).map_err(|error| match error {
        AwaitError::TimedOut => Errno::EAGAIN,
        AwaitError::Interrupted => Errno::EINTR,
    })?;
    if info != 0 {
        let mut words = [0u64; 16];
        words[..3].copy_from_slice(&head);
        user::write_words(info, &words)?;
    }
    Ok(head[0])
}
