//! Pipes: a bounded byte queue between the job's processes. A read waits while the pipe is
//! empty and some write end is open (then returns what is there, or 0 at end of file); a
//! write waits while the pipe is full and some read end is open, and with no read end left
//! fails with EPIPE after raising SIGPIPE. Both wait on the pipe's kernel address as a futex
//! key (`sched::wait`), so a process being killed leaves the wait.

use crate::arch::sync::SpinLock;
use crate::linux::uapi;
use crate::linux_consts;
use crate::sched::{self, WaitResult};
use crate::signal::{self, Restart};
use crate::syscall::{user, Errno, SyscallResult, UserAddr};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Linux's default pipe capacity (16 pages); writes of at most `PIPE_BUF` bytes are atomic.
const CAPACITY: usize = 64 * 1024;
linux_consts!(usize: PIPE_BUF; u8: SIGPIPE);

/// The bytes in flight live in a ring of `CAPACITY` bytes (allocated at the first write),
/// `len` of them from `head` on, wrapping. Data moves between the ring and user memory in at
/// most two copies per call, never byte by byte: this kernel's code is emulated on PVM, where
/// a queue of bytes cost tens of instructions per byte.
struct State {
    ring: Vec<u8>,
    head: usize,
    len: usize,
    readers: usize,
    writers: usize,
    /// Changes each side is woken for, as Linux's pipes wake epoll: the read side for every
    /// write, the write side for a read that makes room in a full pipe, both when an end
    /// closes. An edge-triggered epoll reports an end again after each.
    changes_for_readers: u64,
    changes_for_writers: u64,
}

impl State {
    /// The ring's pieces holding `count` bytes from `start` (an offset from the ring's
    /// start, below `CAPACITY`): one range, or two when they wrap.
    fn pieces(start: usize, count: usize) -> [core::ops::Range<usize>; 2] {
        let first = count.min(CAPACITY - start);
        [start..start + first, 0..count - first]
    }

    /// Appends `count` bytes (at most the room left) that `fill(offset, piece)` supplies,
    /// `offset` counting from the first of them; nothing is appended if `fill` fails.
    fn push(&mut self, count: usize, fill: &impl Fn(u64, &mut [u8]) -> Result<(), Errno>) -> Result<(), Errno> {
        if self.ring.is_empty() {
            self.ring = alloc::vec![0; CAPACITY];
        }
        let mut offset = 0;
        for piece in Self::pieces((self.head + self.len) % CAPACITY, count) {
            fill(offset as u64, &mut self.ring[piece.clone()])?;
            offset += piece.len();
        }
        self.len += count;
        Ok(())
    }

    /// Copies the first `count` bytes (at most `len`) to user memory at `buffer` and takes
    /// them off the ring; nothing is taken if a copy faults.
    fn pop_to_user(&mut self, buffer: UserAddr, count: usize) -> Result<(), Errno> {
        let mut offset = 0;
        for piece in Self::pieces(self.head, count) {
            user::write_bytes(buffer + offset as u64, &self.ring[piece.clone()])?;
            offset += piece.len();
        }
        self.head = (self.head + count) % CAPACITY;
        self.len -= count;
        Ok(())
    }
}

pub struct Pipe {
    state: SpinLock<State>,
}

impl Pipe {
    /// The key its waiters wait on: the pipe's own (kernel) address.
    fn key(&self) -> u64 {
        self as *const Pipe as u64
    }
}

/// One end of a pipe, held by an open file description: when the last descriptor naming it
/// closes (in every process), the end closes and the other side's waiters wake.
pub struct PipeEnd {
    pipe: Arc<Pipe>,
    writer: bool,
    /// O_NONBLOCK (a status flag of the open file description, as `fcntl(F_SETFL)` sets it).
    pub non_blocking: bool,
    /// A call's own handle (`share`): its drop closes no open file description.
    temporary: bool,
}

/// `poll`'s event bits (Linux's values).
pub const POLLIN: u16 = uapi::POLLIN as u16;
linux_consts!(pub u16: POLLOUT, POLLERR, POLLHUP, POLLRDNORM, POLLWRNORM);

impl PipeEnd {
    pub fn is_writer(&self) -> bool {
        self.writer
    }

    /// A watch on this end for `poll`, `select` and epoll: it sees the pipe's state without
    /// counting as an open end (an epoll set must not keep a pipe open).
    pub fn watch(&self) -> PipeWatch {
        PipeWatch { pipe: self.pipe.clone(), writer: self.writer }
    }

    /// Another handle on the same end, for a call that works without the descriptor's lock
    /// (it may wait); counts as an open end while it lives, as the descriptor does.
    pub fn share(&self) -> PipeEnd {
        let mut state = self.pipe.state.lock();
        if self.writer {
            state.writers += 1;
        } else {
            state.readers += 1;
        }
        PipeEnd { pipe: self.pipe.clone(), writer: self.writer, non_blocking: self.non_blocking, temporary: true }
    }
}

impl Drop for PipeEnd {
    fn drop(&mut self) {
        {
            let mut state = self.pipe.state.lock();
            let left = if self.writer {
                state.writers -= 1;
                state.writers
            } else {
                state.readers -= 1;
                state.readers
            };
            // An open file description closing wakes both sides on Linux; a call's handle
            // going counts only if it was the side's last.
            if !self.temporary || left == 0 {
                state.changes_for_readers += 1;
                state.changes_for_writers += 1;
            }
        }
        sched::wake_kernel_key(self.pipe.key());
    }
}

/// What watches one end of a pipe without holding it open (see `PipeEnd::watch`).
#[derive(Clone)]
pub struct PipeWatch {
    pipe: Arc<Pipe>,
    writer: bool,
}

impl PipeWatch {
    /// What `poll` reports for the end, as Linux's pipes: a read end is readable while bytes
    /// wait and hung up once no write end is open; a write end is writable while a small
    /// write (`PIPE_BUF`) would go in at once, and in error once no read end is open. And how
    /// many changes its side has been woken for.
    pub fn poll_events(&self) -> (u16, u64) {
        let state = self.pipe.state.lock();
        if self.writer {
            let room = if CAPACITY - state.len >= PIPE_BUF { POLLOUT | POLLWRNORM } else { 0 };
            (room | if state.readers == 0 { POLLERR } else { 0 }, state.changes_for_writers)
        } else {
            let data = if state.len == 0 { 0 } else { POLLIN | POLLRDNORM };
            (data | if state.writers == 0 { POLLHUP } else { 0 }, state.changes_for_readers)
        }
    }
}

/// A new pipe: its read end and its write end.
pub fn new(non_blocking: bool) -> (PipeEnd, PipeEnd) {
    let pipe = Arc::new(Pipe {
        state: SpinLock::new(State {
            ring: Vec::new(),
            head: 0,
            len: 0,
            readers: 1,
            writers: 1,
            changes_for_readers: 0,
            changes_for_writers: 0,
        }),
    });
    (
        PipeEnd { pipe: pipe.clone(), writer: false, non_blocking, temporary: false },
        PipeEnd { pipe, writer: true, non_blocking, temporary: false },
    )
}

/// `read` from the read end `end` into the user buffer at `buffer`.
pub fn read(end: &PipeEnd, buffer: UserAddr, len: u64, non_blocking: bool) -> SyscallResult {
    if len == 0 {
        return Ok(0);
    }
    let pipe = &end.pipe;
    let mut interrupted = false;
    loop {
        let taken = {
            let mut state = pipe.state.lock();
            if state.len == 0 && state.writers == 0 {
                return Ok(0);
            }
            let count = state.len.min(len as usize);
            if count > 0 {
                // Linux wakes writers only when the pipe was full (no room for a small write).
                let was_full = CAPACITY - state.len < PIPE_BUF;
                state.pop_to_user(buffer, count)?;
                state.changes_for_writers += was_full as u64;
            }
            count
        };
        if taken > 0 {
            // Only the caller's job can watch this pipe (an end closing may be dropped in any
            // job's context: every poller looks again then).
            sched::wake_kernel_key_for(pipe.key(), Some(sched::current_job()));
            return Ok(taken as u64);
        }
        if non_blocking {
            return Err(Errno::EAGAIN);
        }
        let empty_with_writers = || {
            let state = pipe.state.lock();
            state.len == 0 && state.writers != 0
        };
        // A signal ends the wait as on Linux (EINTR, or restarted under SA_RESTART), once a
        // last look has found nothing to read.
        if interrupted {
            return Err(Restart::Always.errno());
        }
        interrupted =
            matches!(sched::wait(pipe.key(), u32::MAX, None, empty_with_writers), Some(WaitResult::Interrupted | WaitResult::Signal));
    }
}

/// `write` of the user buffer at `buffer` to the write end `end`.
pub fn write(end: &PipeEnd, buffer: UserAddr, len: u64, non_blocking: bool) -> SyscallResult {
    write_from(end, len, non_blocking, |offset, piece| user::read_into(buffer + offset, piece))
}

/// `write` of `len` bytes that `fill(offset, piece)` copies into the pipe's ring (from user
/// memory, or from what `writev` gathered: a vector goes in as one write, as on Linux).
pub fn write_from(end: &PipeEnd, len: u64, non_blocking: bool, fill: impl Fn(u64, &mut [u8]) -> Result<(), Errno>) -> SyscallResult {
    let pipe = &end.pipe;
    let mut written = 0u64;
    let mut interrupted = false;
    while written < len {
        let room = {
            let state = pipe.state.lock();
            if state.readers == 0 {
                drop(state);
                if written > 0 {
                    return Ok(written);
                }
                let _ = signal::send(Some(sched::current_tid()), SIGPIPE, signal::SI_USER);
                return Err(Errno::EPIPE);
            }
            CAPACITY - state.len
        };
        // A small write goes in whole or waits; a large one goes in as room appears.
        let wanted = (len - written) as usize;
        let fits = if wanted <= PIPE_BUF { room >= wanted } else { room > 0 };
        if fits {
            // Only this call adds bytes under the lock, and readers only take: the room is
            // still there.
            let count = wanted.min(room);
            let pushed = {
                let mut state = pipe.state.lock();
                let pushed = state.push(count, &|offset, piece| fill(written + offset, piece));
                state.changes_for_readers += pushed.is_ok() as u64;
                pushed
            };
            match pushed {
                Ok(()) => written += count as u64,
                Err(errno) if written == 0 => return Err(errno),
                Err(_) => return Ok(written),
            }
            sched::wake_kernel_key_for(pipe.key(), Some(sched::current_job()));
            continue;
        }
        if non_blocking {
            return if written > 0 { Ok(written) } else { Err(Errno::EAGAIN) };
        }
        let full_with_readers = || {
            let state = pipe.state.lock();
            state.readers != 0 && CAPACITY - state.len < wanted.min(PIPE_BUF)
        };
        // A signal ends the wait as for a read, once a last look has found no room.
        if interrupted {
            return if written > 0 { Ok(written) } else { Err(Restart::Always.errno()) };
        }
        interrupted =
            matches!(sched::wait(pipe.key(), u32::MAX, None, full_with_readers), Some(WaitResult::Interrupted | WaitResult::Signal));
    }
    Ok(written)
}
