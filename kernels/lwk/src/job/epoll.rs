//! Readiness of open files, as `poll`, `select` and epoll see it (`Watch`), and epoll
//! instances (`Epoll`, behind an `epoll_create1` descriptor).
//!
//! A watch holds nothing open: a pipe end's watch is not an end (an epoll set that watched a
//! pipe would otherwise keep it from reaching end of file), and an epoll interest names its
//! open file description weakly, so that closing the last descriptor of a file takes it out
//! of every epoll set, as on Linux. Neither the epoll lock nor a watch's drop ever takes the
//! scheduler's lock: readiness is checked with it held (`sched::wait_for_any_key`).

use super::descriptors::{Descriptor, OpenFile};
use super::pipe::PipeWatch;
use crate::arch::sync::SpinLock;
use crate::syscall::Errno;
use crate::xpmem::Notifier;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;

pub const EPOLLIN: u32 = 0x1;
pub const EPOLLPRI: u32 = 0x2;
pub const EPOLLOUT: u32 = 0x4;
pub const EPOLLERR: u32 = 0x8;
pub const EPOLLHUP: u32 = 0x10;
pub const EPOLLRDNORM: u32 = 0x40;
pub const EPOLLRDBAND: u32 = 0x80;
pub const EPOLLWRNORM: u32 = 0x100;
pub const EPOLLWRBAND: u32 = 0x200;
pub const EPOLLEXCLUSIVE: u32 = 1 << 28;
pub const EPOLLWAKEUP: u32 = 1 << 29;
pub const EPOLLONESHOT: u32 = 1 << 30;
pub const EPOLLET: u32 = 1 << 31;
/// Linux's `EP_PRIVATE_BITS`: what is left of a one-shot interest once it fired.
const PRIVATE_BITS: u32 = EPOLLWAKEUP | EPOLLONESHOT | EPOLLET | EPOLLEXCLUSIVE;
/// Linux's `EPOLLEXCLUSIVE_OK_BITS`: the only bits an exclusive interest may ask for.
pub const EXCLUSIVE_OK_BITS: u32 = EPOLLIN
    | EPOLLOUT
    | EPOLLRDNORM
    | EPOLLRDBAND
    | EPOLLWRNORM
    | EPOLLWRBAND
    | EPOLLERR
    | EPOLLHUP
    | EPOLLWAKEUP
    | EPOLLET
    | EPOLLEXCLUSIVE;
/// Linux's mask for files without a poll method (the console here too: always readable, at
/// end of file, and writable).
const ALWAYS: u32 = EPOLLIN | EPOLLOUT | EPOLLRDNORM | EPOLLWRNORM;

/// What a readiness check looks at for one open file.
#[derive(Clone)]
pub enum Watch {
    /// The console, files, directories, host files, `/dev/xpmem`: always ready.
    Always,
    Pipe(PipeWatch),
    Notifier(Arc<Notifier>),
    /// An epoll instance: readable while some interest of it would be reported; its changes
    /// are its interests' (Linux wakes an instance's pollers when one of its files wakes it).
    Epoll(Arc<Epoll>),
    /// A socket: what the host last said of it (`crate::net`).
    Socket(Arc<crate::net::Socket>),
}

impl Watch {
    pub fn of(descriptor: &Descriptor) -> Watch {
        match descriptor {
            Descriptor::Pipe(end) => Watch::Pipe(end.watch()),
            Descriptor::XpmemNotify { notifier, .. } => Watch::Notifier(notifier.clone()),
            Descriptor::Epoll(epoll) => Watch::Epoll(epoll.clone()),
            Descriptor::Socket(socket) => Watch::Socket(socket.clone()),
            _ => Watch::Always,
        }
    }

    /// The `poll` events of the file now, and how many changes of it have woken its waiters
    /// (an edge-triggered interest is reported again after each).
    pub fn state(&self) -> (u32, u64) {
        match self {
            Watch::Always => (ALWAYS, 0),
            Watch::Pipe(pipe) => {
                let (events, changes) = pipe.poll_events();
                (events as u32, changes)
            }
            Watch::Notifier(notifier) => (if notifier.is_readable() { EPOLLIN | EPOLLRDNORM } else { 0 }, notifier.signals()),
            Watch::Epoll(epoll) => epoll.state(),
            Watch::Socket(socket) => socket.poll_state(),
        }
    }

    pub fn events(&self) -> u32 {
        self.state().0
    }
}

/// Whether epoll can watch `descriptor`: Linux refuses files without a poll method (regular
/// files, directories) with EPERM. The console is a terminal or a pipe to the host, both of
/// which Linux polls.
pub fn can_watch(descriptor: &Descriptor) -> bool {
    matches!(
        descriptor,
        Descriptor::Console | Descriptor::Pipe(_) | Descriptor::XpmemNotify { .. } | Descriptor::Epoll(_) | Descriptor::Socket(_)
    )
}

struct Interest {
    fd: u32,
    file: Weak<SpinLock<Descriptor>>,
    watch: Watch,
    /// What the caller asked for, with EPOLLERR and EPOLLHUP (always reported, as on Linux).
    events: u32,
    data: u64,
    /// Edge-triggered: the change count last reported (`None`: report once ready).
    reported: Option<u64>,
}

impl Interest {
    fn is_open(&self) -> bool {
        self.file.strong_count() != 0
    }

    /// What `epoll_wait` would report now (0: nothing) and the change count behind it.
    fn due(&self) -> (u32, u64) {
        if !self.is_open() || self.events & !PRIVATE_BITS == 0 {
            return (0, 0);
        }
        let (ready, changes) = self.watch.state();
        let events = ready & self.events;
        if events == 0 || (self.events & EPOLLET != 0 && self.reported == Some(changes)) {
            return (0, changes);
        }
        (events, changes)
    }
}

/// One epoll instance: its interests in the order they were added (reported ones move to the
/// end, so that a small `maxevents` serves every ready file in turn, as Linux's ready list).
pub struct Epoll {
    interests: SpinLock<Vec<Interest>>,
}

impl Epoll {
    pub fn new() -> Epoll {
        Epoll { interests: SpinLock::new(Vec::new()) }
    }

    fn find(interests: &[Interest], fd: u32, file: &OpenFile) -> Option<usize> {
        interests.iter().position(|interest| interest.fd == fd && core::ptr::eq(interest.file.as_ptr(), Arc::as_ptr(file)))
    }

    /// EPOLL_CTL_ADD of descriptor `fd` (open file `file`).
    pub fn add(&self, fd: u32, file: &OpenFile, watch: Watch, events: u32, data: u64) -> Result<(), Errno> {
        let mut interests = self.interests.lock();
        interests.retain(Interest::is_open);
        if Self::find(&interests, fd, file).is_some() {
            return Err(Errno::EEXIST);
        }
        interests.push(Interest { fd, file: Arc::downgrade(file), watch, events: events | EPOLLERR | EPOLLHUP, data, reported: None });
        Ok(())
    }

    /// EPOLL_CTL_MOD: new events and data; a one-shot interest that fired is armed again, an
    /// edge-triggered one reports the file again if it is ready (as Linux's MOD does).
    pub fn modify(&self, fd: u32, file: &OpenFile, events: u32, data: u64) -> Result<(), Errno> {
        let mut interests = self.interests.lock();
        let index = Self::find(&interests, fd, file).ok_or(ENOENT)?;
        let interest = &mut interests[index];
        if interest.events & EPOLLEXCLUSIVE != 0 {
            return Err(Errno::EINVAL);
        }
        interest.events = events | EPOLLERR | EPOLLHUP;
        interest.data = data;
        interest.reported = None;
        Ok(())
    }

    /// EPOLL_CTL_DEL.
    pub fn remove(&self, fd: u32, file: &OpenFile) -> Result<(), Errno> {
        let mut interests = self.interests.lock();
        let index = Self::find(&interests, fd, file).ok_or(ENOENT)?;
        interests.remove(index);
        Ok(())
    }

    /// Whether `collect` would report something now.
    pub fn has_ready(&self) -> bool {
        self.interests.lock().iter().any(|interest| interest.due().0 != 0)
    }

    /// The instance as a watched file: `EPOLLIN` while something is due, and the sum of its
    /// open interests' change counts.
    fn state(&self) -> (u32, u64) {
        let interests = self.interests.lock();
        let mut due = false;
        let mut changes = 0u64;
        for interest in interests.iter().filter(|interest| interest.is_open()) {
            let (events, interest_changes) = interest.due();
            due |= events != 0;
            changes = changes.wrapping_add(interest_changes);
        }
        (if due { EPOLLIN | EPOLLRDNORM } else { 0 }, changes)
    }

    /// Linux's `ep_loop_check` for adding this instance to `target`: ELOOP if `target` is
    /// reachable from here (a cycle) or the instances below this one nest deeper than
    /// `MAX_NESTS`. Runs under `NESTING`, so that no other addition changes the graph meanwhile.
    pub fn check_nesting(&self, target: &Epoll, depth: usize) -> Result<(), Errno> {
        if core::ptr::eq(self, target) || depth > MAX_NESTS {
            return Err(Errno::ELOOP);
        }
        let inner: Vec<Arc<Epoll>> = self
            .interests
            .lock()
            .iter()
            .filter(|interest| interest.is_open())
            .filter_map(|interest| match &interest.watch {
                Watch::Epoll(epoll) => Some(epoll.clone()),
                _ => None,
            })
            .collect();
        inner.iter().try_for_each(|epoll| epoll.check_nesting(target, depth + 1))
    }

    /// Takes up to `max` due events (events, data), marking edge-triggered interests as
    /// reported and disarming one-shot ones; reported interests move to the end.
    pub fn collect(&self, max: usize) -> Vec<(u32, u64)> {
        let mut interests = self.interests.lock();
        interests.retain(Interest::is_open);
        let mut events = Vec::new();
        let mut reported = Vec::new();
        for (index, interest) in interests.iter_mut().enumerate() {
            if events.len() == max {
                break;
            }
            let (due, changes) = interest.due();
            if due == 0 {
                continue;
            }
            events.push((due, interest.data));
            reported.push(index);
            if interest.events & EPOLLET != 0 {
                interest.reported = Some(changes);
            }
            if interest.events & EPOLLONESHOT != 0 {
                interest.events &= PRIVATE_BITS;
            }
        }
        for (moved, index) in reported.into_iter().enumerate() {
            let interest = interests.remove(index - moved);
            interests.push(interest);
        }
        events
    }
}

/// Linux's `EP_MAX_NESTS`: how deep epoll instances may nest.
const MAX_NESTS: usize = 4;

/// Held while an epoll instance is added to another: the loop check and the addition happen
/// with no other nesting change in between (Linux's `epnested_mutex`).
pub static NESTING: SpinLock<()> = SpinLock::new(());

const ENOENT: Errno = Errno::ENOENT;
