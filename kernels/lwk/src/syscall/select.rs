//! select, pselect6.
//!
//! select(nfds, readfds, writefds, exceptfds, timeout): `poll` over three descriptor bit sets
//! (each NULL or `ceil(nfds / 64)` 64-bit words, as Linux reads them). As on Linux:
//! - `nfds` < 0 is EINVAL; above the size of the process's descriptor table (as Linux sizes
//!   it: 64, doubled as higher numbers are used, at most the limit of 1024) it is cut to that
//!   size: bits past it are never read, an `nfds` above `FD_SETSIZE` is no error;
//! - a set bit naming a closed descriptor is EBADF (the sets are left as they were);
//! - readiness is `poll`'s (`super::poll`): readable on `POLLIN`, `POLLHUP` or `POLLERR`,
//!   writable on `POLLOUT` or `POLLERR`, exceptional on `POLLPRI` (never, here);
//! - the result counts set bits over the three sets, which come back holding only the ready
//!   descriptors (all clear when the time ran out);
//! - `timeout` (`struct timeval`; NULL: no limit) has its microseconds carried into seconds,
//!   a negative part is EINVAL, and the time left is written back to it (Linux's select
//!   does; a failed write is ignored);
//! - a signal ends the wait with EINTR after a handler (ERESTARTNOHAND; the sets are left as
//!   they were, the time left written back).

use super::poll::{wait_until_ready, watch_of};
use super::time::deadline_after;
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::clock;
use crate::job;
use crate::job::epoll::{EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EPOLLPRI, EPOLLRDBAND, EPOLLRDNORM, EPOLLWRBAND, EPOLLWRNORM};
use crate::linux::{timespec, timeval};
use crate::signal::{self, Restart};
use crate::{linux_field, linux_struct};
use alloc::vec;
use alloc::vec::Vec;
use core::mem::size_of;

/// Linux's `POLLIN_SET`, `POLLOUT_SET` and `POLLEX_SET`: what makes a descriptor readable,
/// writable or exceptional.
const SET_EVENTS: [u32; 3] =
    [EPOLLRDNORM | EPOLLRDBAND | EPOLLIN | EPOLLHUP | EPOLLERR, EPOLLWRBAND | EPOLLWRNORM | EPOLLOUT | EPOLLERR, EPOLLPRI];

/// How a `select` timeout is written back.
#[derive(Clone, Copy)]
enum TimeFormat {
    /// `struct timeval` (select)
    Micro,
    /// `struct timespec` (pselect6)
    Nano,
}

/// The common part of `select` and `pselect6`: `sets` are the three user addresses (NULL:
/// none), `deadline` monotonic ns (`None`: no limit), `timeout` the user's timeout to write
/// the time left to (NULL: none); `interrupted`: a signal is due already.
fn wait_for_sets(
    nfds: i32,
    sets: [UserAddr; 3],
    deadline: Option<u64>,
    timeout: (UserAddr, TimeFormat),
    interrupted: bool,
) -> SyscallResult {
    if nfds < 0 {
        return Err(Errno::EINVAL);
    }
    let table_size = job::with_process(|process| process.descriptors.linux_table_size());
    let nfds = (nfds as usize).min(table_size);
    let words = nfds.div_ceil(64);
    // Each set as 64-bit words, only its first `nfds` bits counting.
    let mut wanted: [Vec<u64>; 3] = [vec![0; words], vec![0; words], vec![0; words]];
    for (set, &address) in wanted.iter_mut().zip(&sets) {
        if address.is_null() || words == 0 {
            continue;
        }
        let bytes = user::read_bytes(address, words * 8)?;
        for (word, chunk) in set.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_le_bytes(chunk.try_into().unwrap());
        }
        if nfds % 64 != 0 {
            set[words - 1] &= (1u64 << (nfds % 64)) - 1;
        }
    }
    // The watched descriptors, each with the sets that name it (bit i: set i).
    let mut watched = Vec::new();
    for descriptor in 0..nfds {
        let (word, bit) = (descriptor / 64, 1u64 << (descriptor % 64));
        let in_sets = (0..3).filter(|&set| wanted[set][word] & bit != 0).fold(0u8, |sets, set| sets | 1 << set);
        if in_sets != 0 {
            watched.push((descriptor, in_sets, watch_of(Fd(descriptor as i32)).ok_or(Errno::EBADF)?));
        }
    }
    let count_ready = || {
        watched
            .iter()
            .map(|(_, in_sets, watch)| {
                let events = watch.events();
                (0..3).filter(|&set| in_sets & (1 << set) != 0 && events & SET_EVENTS[set] != 0).count() as u64
            })
            .sum::<u64>()
    };
    let waited = wait_until_ready(deadline, interrupted, || count_ready() != 0);
    write_time_left(timeout, deadline);
    if waited.is_err() {
        return Err(Restart::NoHandler.errno());
    }
    let mut ready = [vec![0u64; words], vec![0u64; words], vec![0u64; words]];
    let mut count = 0;
    for (descriptor, in_sets, watch) in &watched {
        let events = watch.events();
        for set in 0..3 {
            if in_sets & (1 << set) != 0 && events & SET_EVENTS[set] != 0 {
                ready[set][descriptor / 64] |= 1 << (descriptor % 64);
                count += 1;
            }
        }
    }
    for (set, &address) in ready.iter().zip(&sets) {
        if !address.is_null() && words != 0 {
            user::write_words(address, set)?;
        }
    }
    Ok(count)
}

/// Writes the time left before `deadline` (none once it passed) to the user's timeout, as
/// Linux's `poll_select_finish`; a failed write is ignored.
fn write_time_left((address, format): (UserAddr, TimeFormat), deadline: Option<u64>) {
    let Some(deadline) = deadline else { return };
    if address.is_null() {
        return;
    }
    let left = deadline.saturating_sub(clock::monotonic_ns());
    let (seconds, fraction) = ((left / 1_000_000_000) as i64, (left % 1_000_000_000) as i64);
    let record = match format {
        TimeFormat::Micro => linux_struct!(timeval { tv_sec: seconds, tv_usec: fraction / 1000 }),
        TimeFormat::Nano => linux_struct!(timespec { tv_sec: seconds, tv_nsec: fraction }),
    };
    let _ = user::write_bytes(address, &record);
}

pub fn select(nfds: i32, read: UserAddr, write: UserAddr, except: UserAddr, timeout: UserAddr) -> SyscallResult {
    let deadline = match timeout.non_null() {
        None => None,
        Some(address) => {
            let mut bytes = [0u8; size_of::<timeval>()];
            user::read_into(address, &mut bytes)?;
            let (seconds, micros): (i64, i64) = (linux_field!(&bytes, timeval, tv_sec), linux_field!(&bytes, timeval, tv_usec));
            // Linux carries whole seconds out of the microseconds before it checks.
            let seconds = seconds.checked_add(micros / 1_000_000).ok_or(Errno::EINVAL)?;
            let nanos = (micros % 1_000_000) * 1000;
            if seconds < 0 || nanos < 0 {
                return Err(Errno::EINVAL);
            }
            Some(clock::monotonic_ns().saturating_add((seconds as u64).saturating_mul(1_000_000_000)).saturating_add(nanos as u64))
        }
    };
    wait_for_sets(nfds, [read, write, except], deadline, (timeout, TimeFormat::Micro), false)
}

/// pselect6(nfds, readfds, writefds, exceptfds, timeout, sigmask): `select` with a
/// `struct timespec` timeout (NULL: no limit; nanoseconds outside 0..10^9 or negative seconds
/// EINVAL; the time left written back, as Linux's system call does: libc hides it) and, in the
/// sixth argument, the address of `{ const sigset_t *mask; size_t size; }` (NULL, or a NULL
/// mask: none; a size other than 8 EINVAL): the signal mask it waits under, as `ppoll`'s.
pub fn pselect6(nfds: i32, read: UserAddr, write: UserAddr, except: UserAddr, timeout: UserAddr, mask_argument: UserAddr) -> SyscallResult {
    let deadline = deadline_after(timeout)?;
    let mask = match mask_argument.non_null() {
        None => UserAddr(0),
        Some(address) => {
            let [mask, size] = user::read_words::<2>(address)?;
            if mask != 0 && size != 8 {
                return Err(Errno::EINVAL);
            }
            UserAddr(mask)
        }
    };
    let sets = [read, write, except];
    if mask.is_null() {
        return wait_for_sets(nfds, sets, deadline, (timeout, TimeFormat::Nano), false);
    }
    let [mask] = user::read_words::<1>(mask)?;
    signal::wait_under_mask(mask, |due| wait_for_sets(nfds, sets, deadline, (timeout, TimeFormat::Nano), due))
}
