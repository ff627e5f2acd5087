//! poll, ppoll.
//!
//! poll(fds, nfds, timeout): waits until one of the descriptors is ready, `timeout` ms pass
//! (negative: no limit; 0: just look) or a signal ends the wait (EINTR after a handler, as
//! Linux's ERESTARTNOHAND). Readiness, as Linux reports it:
//! - pipes: a read end `POLLIN` while bytes wait, `POLLHUP` once no write end is open; a write
//!   end `POLLOUT` while `PIPE_BUF` bytes fit, `POLLERR` once no read end is open;
//! - XEMEM notify descriptors (`xemem_notify_fd`): `POLLIN` while a signal count waits;
//! - epoll descriptors: `POLLIN` while `epoll_wait` would report something;
//! - everything else (the console, files, directories, host files, `/dev/xpmem`) is always
//!   readable and writable, as Linux's default for files without a poll method;
//! - a negative fd is skipped (revents 0), a closed one is `POLLNVAL`.
//!
//! Waiting (`wait_until_ready`, shared with `select` and `epoll_wait`) rides the kernel keys
//! pipes, sockets and notifiers wake (`sched::wait_for_any_key`), host messages included (a
//! socket's `SocketReady`, a signal's `Notify`). In a persistent enclave such a message may
//! end a wait no thread of the job can end, so the wait there never counts toward a
//! dead-lock (`sched::wait_for_host`), and sleeps until a change of readiness wakes it. It
//! once slept in 100 ms slices for that: every thread an MPI rank's libraries park in
//! epoll_wait (PMIx's, Open MPI's, UCX's) then woke ten times a second, each time two ticks
//! and two switches of emulated kernel code taken from the rank's spinning main thread
//! (then 10 s slices, 5899b72).

use super::time::deadline_after;
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::job;
use crate::job::descriptors::MAX_DESCRIPTORS;
use crate::job::epoll::Watch;
use crate::job::pipe::{POLLERR, POLLHUP};
use crate::linux::pollfd;
use crate::linux::uapi;
use crate::linux_field;
use crate::sched::WaitResult;
use crate::signal::{self, Restart};
use alloc::vec::Vec;
use core::mem::{offset_of, size_of};

const POLLNVAL: u16 = uapi::POLLNVAL as u16;
/// `struct pollfd`'s size and where its revents are.
const ENTRY: usize = size_of::<pollfd>();
const REVENTS: usize = offset_of!(pollfd, revents);

/// What one `struct pollfd` watches.
enum Watched {
    Skipped,
    Closed,
    Open(Watch),
}

impl Watched {
    fn of(descriptor: i32) -> Watched {
        if descriptor < 0 {
            return Watched::Skipped;
        }
        match watch_of(Fd(descriptor)) {
            None => Watched::Closed,
            Some(watch) => Watched::Open(watch),
        }
    }

    fn events(&self) -> u16 {
        match self {
            Watched::Skipped => 0,
            Watched::Closed => POLLNVAL,
            Watched::Open(watch) => watch.events() as u16,
        }
    }
}

/// The readiness of the calling process's `descriptor`, `None` when it is not open.
pub fn watch_of(descriptor: Fd) -> Option<Watch> {
    job::with_process(|process| process.descriptors.get(descriptor).map(|open| Watch::of(&open)))
}

/// The events of `watched` that entry `requested` reports (errors, hang-ups and invalid
/// descriptors whether asked for or not).
fn reported(watched: &Watched, requested: u16) -> u16 {
    watched.events() & (requested | POLLERR | POLLHUP | POLLNVAL)
}

/// A signal ended a readiness wait before anything was ready.
pub struct Interrupted;

/// The wait of `poll`, `select` and `epoll_wait`: returns once `ready()` holds or `deadline`
/// (monotonic ns; `None`: no limit) passes; `Interrupted` if a signal comes first (or is due
/// already: `interrupted`), unless `ready()` holds by then (ready descriptors win, as on
/// Linux). Rides the kernel keys pipes and notifiers wake (`sched::wait_for_any_key`); in a
/// persistent enclave the host may end it too (see above).
pub fn wait_until_ready(deadline: Option<u64>, interrupted: bool, ready: impl Fn() -> bool) -> Result<(), Interrupted> {
    let mut interrupted = interrupted;
    loop {
        let now = crate::clock::monotonic_ns();
        if ready() || deadline.is_some_and(|deadline| now >= deadline) {
            return Ok(());
        }
        if interrupted {
            return Err(Interrupted);
        }
        let result = crate::sched::wait_for_any_key(deadline, crate::enclave::is_active(), || !ready());
        interrupted = matches!(result, Some(WaitResult::Interrupted | WaitResult::Signal));
    }
}

/// The common part of `poll` and `ppoll`: waits until `deadline` (monotonic ns; `None`: no
/// limit) and writes each entry's revents; returns how many entries have some. `interrupted`:
/// a signal is due already (ready descriptors still win, as on Linux).
fn wait_for_events(fds: UserAddr, count: u32, deadline: Option<u64>, interrupted: bool) -> SyscallResult {
    if count as usize > MAX_DESCRIPTORS {
        return Err(Errno::EINVAL);
    }
    let mut entries = user::read_bytes(fds, count as usize * ENTRY)?;
    let watched: Vec<(Watched, u16)> = entries
        .chunks_exact(ENTRY)
        .map(|entry| (Watched::of(linux_field!(entry, pollfd, fd)), linux_field!(entry, pollfd, events)))
        .collect();
    let any_ready = || watched.iter().any(|(watched, requested)| reported(watched, *requested) != 0);
    if wait_until_ready(deadline, interrupted, any_ready).is_err() {
        // Linux writes the (empty) revents back before it leaves for the signal.
        for entry in entries.chunks_exact_mut(ENTRY) {
            entry[REVENTS..REVENTS + 2].fill(0);
        }
        drop(watched);
        user::write_bytes(fds, &entries)?;
        return Err(Restart::NoHandler.errno());
    }
    let mut ready = 0;
    for (entry, (watched, requested)) in entries.chunks_exact_mut(ENTRY).zip(&watched) {
        let revents = reported(watched, *requested);
        entry[REVENTS..REVENTS + 2].copy_from_slice(&revents.to_le_bytes());
        ready += (revents != 0) as u64;
    }
    user::write_bytes(fds, &entries)?;
    Ok(ready)
}

/// The deadline of a timeout in milliseconds (negative: none), as `poll` and `epoll_wait`
/// take it.
pub fn timeout_deadline(timeout: i32) -> Option<u64> {
    (timeout >= 0).then(|| crate::clock::monotonic_ns().saturating_add(timeout as u64 * 1_000_000))
}

pub fn poll(fds: UserAddr, count: u32, timeout: i32) -> SyscallResult {
    wait_for_events(fds, count, timeout_deadline(timeout), false)
}

/// ppoll(fds, nfds, timeout, sigmask, sigsetsize): `poll` with a `struct timespec` timeout
/// (NULL: no limit) and, if `sigmask` is given, that signal mask while it waits (a signal that
/// ends the wait is handled under it, as after `rt_sigsuspend`).
pub fn ppoll(fds: UserAddr, count: u32, timeout: UserAddr, mask: UserAddr, set_size: usize) -> SyscallResult {
    let deadline = deadline_after(timeout)?;
    if mask.is_null() {
        return wait_for_events(fds, count, deadline, false);
    }
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let [mask] = user::read_words::<1>(mask)?;
    // A signal the mask lets through may be pending already: it ends the call before any
    // wait, unless some descriptor is ready.
    signal::wait_under_mask(mask, |due| wait_for_events(fds, count, deadline, due))
}
