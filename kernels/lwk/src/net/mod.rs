//! Sockets of a persistent enclave's job, served by the host's network stack in the job user's
//! name (`enclave_proto::socket`; the host side is clowderd's `sockets`). A socket descriptor
//! names the host's handle for one socket. The host never waits: a call that would block
//! answers EAGAIN, and a blocking call here then sleeps its thread (only it) on the socket's
//! readiness, which the host pushes (`SocketReady`) and every answer carries, until the socket
//! is ready or a signal comes (ERESTARTSYS: restarted under SA_RESTART, else EINTR, as Linux).
//! `poll`, `select` and epoll read the same readiness (`crate::job::epoll::Watch::Socket`).
//!
//! Data never passes through this kernel: a send or receive names the guest-physical runs of
//! the job's buffers (all of an iovec in one request) and the host reads or writes them there
//! (`crate::enclave::files::user_run`); pieces outside the enclave's RAM (an executable's
//! read-only pages) go through the CPU's bounce buffer.

use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::arch::trap::{copy_from_user, copy_to_user};
use crate::enclave::files::{self as host_files, Run as Piece};
use crate::linux::Errno;
use crate::sched::{self, WaitResult};
use crate::signal::Restart;
use crate::syscall::UserAddr;
use alloc::collections::BTreeMap;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use enclave_proto::{List, Run, SocketOp};

pub const POLLIN: u32 = 0x1;
pub const POLLOUT: u32 = 0x4;
pub const POLLERR: u32 = 0x8;
pub const POLLHUP: u32 = 0x10;
/// Runs one send or receive names at most (a longer vector is several requests).
const MAX_RUNS: usize = 1024;
/// Bytes one send or receive moves at most.
const MAX_TRANSFER: u64 = 64 << 20;

/// One socket: the host's handle, its status flags and what the host last said of its
/// readiness.
pub struct Socket {
    pub handle: u32,
    /// Its job: the host numbers each job's sockets apart.
    job: u32,
    /// SOCK_STREAM, SOCK_DGRAM, ... (without the flags).
    pub kind: u32,
    non_blocking: AtomicBool,
    events: AtomicU32,
    /// Readiness reports so far (an edge-triggered epoll reports the socket again after each).
    changes: AtomicU64,
}

/// Sockets by job and host handle, for the host's readiness reports.
static SOCKETS: SpinLock<BTreeMap<(u32, u32), Weak<Socket>>> = SpinLock::new(BTreeMap::new());

/// A call in flight: the socket it is about, then the answer.
enum Pending {
    Waiting(Option<u32>),
    Answered(Answer),
}

pub struct Answer {
    pub result: i64,
    pub events: u32,
    pub data: Vec<u8>,
}

static PENDING: SpinLock<BTreeMap<u32, Pending>> = SpinLock::new(BTreeMap::new());

impl Socket {
    /// A socket the host made for the calling thread's job, with its first readiness;
    /// registered for the host's reports.
    pub fn new(handle: u32, kind: u32, non_blocking: bool, events: u32) -> Arc<Socket> {
        let job = sched::current_job();
        let socket = Arc::new(Socket {
            handle,
            job,
            kind,
            non_blocking: AtomicBool::new(non_blocking),
            events: AtomicU32::new(events),
            changes: AtomicU64::new(0),
        });
        SOCKETS.lock().insert((job, handle), Arc::downgrade(&socket));
        socket
    }

    fn key(&self) -> u64 {
        self as *const Socket as u64
    }

    pub fn non_blocking(&self) -> bool {
        self.non_blocking.load(Ordering::Relaxed)
    }

    pub fn set_non_blocking(&self, non_blocking: bool) {
        self.non_blocking.store(non_blocking, Ordering::Relaxed);
    }

    /// Its `poll` events now and how many reports changed them.
    pub fn poll_state(&self) -> (u32, u64) {
        (self.events.load(Ordering::Acquire), self.changes.load(Ordering::Acquire))
    }

    fn update(&self, events: u32) {
        if self.events.swap(events, Ordering::AcqRel) != events {
            self.changes.fetch_add(1, Ordering::AcqRel);
            sched::wake_kernel_key_for(self.key(), Some(self.job));
        }
    }

    /// Runs `op` on the host until it does not say EAGAIN, sleeping on the socket's
    /// readiness for `wanted` (or an error or hang-up) in between, unless the socket or the
    /// call (`dont_wait`) is non-blocking. A signal ends the wait with ERESTARTSYS.
    pub fn call_blocking<'a>(&self, wanted: u32, dont_wait: bool, op: &dyn Fn() -> SocketOp<'a>) -> Result<Answer, Errno> {
        loop {
            let answer = request(op());
            if answer.result != -(Errno::EAGAIN.0 as i64) || dont_wait || self.non_blocking() {
                return Ok(answer);
            }
            self.wait_for(wanted)?;
        }
    }

    /// Sleeps until the socket shows one of `wanted` (or an error or hang-up); ERESTARTSYS if
    /// a signal comes first.
    pub fn wait_for(&self, wanted: u32) -> Result<(), Errno> {
        let wanted = wanted | POLLERR | POLLHUP;
        let not_ready = || self.events.load(Ordering::Acquire) & wanted == 0;
        while not_ready() {
            if let Some(WaitResult::Interrupted | WaitResult::Signal) = sched::wait_for_host(self.key(), None, not_ready) {
                return Err(Restart::Always.errno());
            }
        }
        Ok(())
    }
}

/// The last descriptor is gone: the host closes its socket (no answer is awaited).
impl Drop for Socket {
    fn drop(&mut self) {
        SOCKETS.lock().remove(&(self.job, self.handle));
        if crate::enclave::is_active() {
            crate::enclave::send_socket_request(self.job, SocketOp::Close { handle: self.handle }, |_| {});
        }
    }
}

/// Sends `op` for the running job and waits for the answer: keeping the CPU, as forwarded
/// file calls do, while no other thread waits for it; else asleep, woken by the answer
/// (`answer`). The host's answer can take long when many ranks share an enclave (seconds at
/// a load of 15), and ranks whose threads kept both CPUs through such waits never got through
/// `MPI_Init`.
pub fn request(op: SocketOp<'_>) -> Answer {
    let handle = op.handle();
    // Registered before sending, so an answer that comes at once finds its entry.
    let mut request = 0;
    crate::enclave::send_socket_request(sched::current_job(), op, |number| {
        request = number;
        PENDING.lock().insert(number, Pending::Waiting(handle));
    });
    let answered = || matches!(PENDING.lock().get(&request), Some(Pending::Answered(_)));
    while !answered() && !sched::current_thread_doomed() {
        if sched::others_wait_here() {
            sched::wait_for_host(answer_key(request), None, || !answered());
        } else {
            crate::enclave::serve_host_until(|| answered() || sched::others_wait_here());
        }
    }
    match PENDING.lock().remove(&request) {
        Some(Pending::Answered(answer)) => answer,
        _ => Answer { result: -(Errno::EIO.0 as i64), events: 0, data: Vec::new() },
    }
}

/// The host's `SocketResult` for job `job` (from the channel's drain): the socket's readiness
/// is taken in the order the host sent it, before any later report.
pub fn answer(job: u32, request: u32, result: i64, events: u32, data: &[u8]) {
    let mut pending = PENDING.lock();
    let Some(entry) = pending.get_mut(&request) else { return };
    let handle = match entry {
        Pending::Waiting(handle) => *handle,
        Pending::Answered(_) => return,
    };
    *entry = Pending::Answered(Answer { result, events, data: data.to_vec() });
    drop(pending);
    sched::wake_kernel_key_for(answer_key(request), Some(job));
    if let Some(socket) = handle.and_then(|handle| socket_of_handle(job, handle)) {
        socket.update(events);
    }
}

/// The host's `SocketReady`: a socket of job `job` changed readiness.
pub fn ready(job: u32, handle: u32, events: u32) {
    if let Some(socket) = socket_of_handle(job, handle) {
        socket.update(events);
    }
}

/// Keys the threads waiting for answers sleep on (`request`): one kernel address per request
/// number, modulo the table (a shared key only wakes a thread that then looks again).
static ANSWER_KEYS: [u8; 1024] = [0; 1024];

fn answer_key(request: u32) -> u64 {
    ANSWER_KEYS.as_ptr() as u64 + (request as u64 % ANSWER_KEYS.len() as u64)
}

fn socket_of_handle(job: u32, handle: u32) -> Option<Arc<Socket>> {
    SOCKETS.lock().get(&(job, handle)).and_then(Weak::upgrade)
}

/// The job ended: forget its sockets' calls (its sockets went with its descriptors).
pub fn forget_job() {
    PENDING.lock().clear();
    SOCKETS.lock().clear();
}

/// A result as a system call's (negative values are negated errnos).
pub fn result_of(value: i64) -> Result<u64, Errno> {
    host_files::to_syscall_result(value)
}

/// The guest-physical runs of a job's buffers (`pieces`: address and length each), at most
/// `MAX_RUNS` runs and `MAX_TRANSFER` bytes, the host writing them when `host_writes`; a piece
/// outside RAM goes through this CPU's bounce buffer (then it is the last piece): `bounced` is
/// its user address and length, to copy back after a receive. EFAULT if the first byte cannot
/// be reached.
pub struct Runs {
    pub runs: Vec<Run>,
    pub bounced: Option<(u64, u64, u64)>,
}

pub fn runs_of(pieces: &[(UserAddr, u64)], host_writes: bool) -> Result<Runs, Errno> {
    let mut runs = Vec::new();
    let mut total = 0u64;
    let mut bounced = None;
    'pieces: for &(base, len) in pieces {
        let mut done = 0u64;
        while done < len {
            if runs.len() == MAX_RUNS || total >= MAX_TRANSFER {
                break 'pieces;
            }
            let address = base.0 + done;
            let want = (len - done).min(MAX_TRANSFER - total);
            let (gpa, chunk) = match host_files::user_run(address, want, host_writes) {
                Some(Piece::Ram { gpa, len }) => (gpa, len),
                Some(Piece::Elsewhere { len }) => {
                    let bounce = host_files::bounce().ok_or(Errno::ENOMEM)?;
                    if !host_writes && copy_from_user(phys::bytes_mut(bounce, len as usize), address).is_err() {
                        return Err(Errno::EFAULT);
                    }
                    runs.push(Run { gpa: bounce, len: len as u32 });
                    bounced = Some((address, bounce, len));
                    break 'pieces;
                }
                None if runs.is_empty() && len > 0 => return Err(Errno::EFAULT),
                None => break 'pieces,
            };
            runs.push(Run { gpa, len: chunk as u32 });
            done += chunk;
            total += chunk;
        }
    }
    Ok(Runs { runs, bounced })
}

impl Runs {
    pub fn list(&self) -> List<'_, Run> {
        List::new(&self.runs)
    }

    /// After a receive of `count` bytes: the bounced piece's share goes to the user.
    pub fn copy_back(&self, count: u64) -> Result<(), Errno> {
        let Some((address, bounce, len)) = self.bounced else { return Ok(()) };
        let before: u64 = self.runs[..self.runs.len() - 1].iter().map(|run| run.len as u64).sum();
        let share = count.saturating_sub(before).min(len);
        if share > 0 {
            copy_to_user(address, phys::bytes(bounce, share as usize)).map_err(|_| Errno::EFAULT)?;
        }
        Ok(())
    }
}
