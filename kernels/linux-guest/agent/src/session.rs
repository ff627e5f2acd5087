//! The agent's side of the enclave protocol (crates/enclave-proto): says `Hello`, answers
//! `Ping`, runs `LaunchJob`s as Linux processes and streams their output and exit back. The
//! channel is polled from user space; the guest cannot ring the host's doorbell from ring 3 on
//! PVM (`out` raises #GP there), so the host finds our messages when it next polls.

use std::collections::{HashMap, VecDeque};
use std::sync::{mpsc, Arc};
use std::thread::Thread;
use std::time::{Duration, Instant};

use clowder_channel::{Endpoint, RecvError, SendError};
use enclave_proto::{max_output_chunk, EnclaveMessage, FileOp, Fragmenter, HostMessage, Reassembler, MAX_MESSAGE_LEN, PROTOCOL_VERSION};

use crate::host_files::{FileAnswer, FileCall, Forwarded, Forwarder};
use crate::job::{self, Event, Job};

/// A sender to the session's thread that also wakes it, so the loop can sleep long when idle
/// (each wake-up is emulated guest kernel work on PVM) and still take a job's event or a file
/// call at once.
pub struct Waking<T> {
    sender: mpsc::Sender<T>,
    session: Thread,
}

impl<T> Clone for Waking<T> {
    fn clone(&self) -> Self {
        Waking { sender: self.sender.clone(), session: self.session.clone() }
    }
}

impl<T> Waking<T> {
    fn to_this_thread(sender: mpsc::Sender<T>) -> Waking<T> {
        Waking { sender, session: std::thread::current() }
    }

    /// Sends `value` and wakes the session; an error when the session is gone.
    pub fn send(&self, value: T) -> Result<(), mpsc::SendError<T>> {
        self.sender.send(value)?;
        self.session.unpark();
        Ok(())
    }
}

/// Where the job's files come from: the guest-physical memory the host placed them in.
pub trait PhysicalMemory {
    fn read(&self, gpa: u64, len: u64) -> Result<Vec<u8>, String>;
    /// Calls `with` on the `len` bytes at `gpa`, in place where they can be mapped: a job's
    /// file is copied, and its copy checked, straight against the host's region (a copy of
    /// its own would be no truth to check against). By default on what `read` returns.
    fn with_bytes(&self, gpa: u64, len: u64, with: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        with(&self.read(gpa, len)?);
        Ok(())
    }
    /// Writes `data` at `gpa` (what a job writes to a host file goes through the file window).
    fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String>;
}

/// Guest RAM the kernel leaves alone (`memmap=`, set by the daemon) where the daemon writes
/// what the jobs' forwarded file calls read: `clowder.files=<gpa>,<size>` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileWindow {
    pub gpa: u64,
    pub size: u32,
}

/// What the host answered a file call with.
#[derive(Debug)]
enum HostAnswer {
    /// A value, or a negative errno.
    Result(i64),
    Attributes(enclave_proto::FileAttributes),
}

/// The largest errno a FUSE reply may carry (the guest kernel refuses the reply otherwise and
/// the call would never end).
const MAX_FUSE_ERRNO: i64 = 511;

/// What a checked answer gives the call.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    Reply(FileAnswer),
    /// This many bytes of the window, read or listed for the call.
    Read(u64),
}

/// Checks the host's `answer` against `call` (see `Session::answered`); what was wrong.
fn checked_answer(call: &FileCall, window: FileWindow, answer: HostAnswer) -> Result<Checked, String> {
    // The bytes the call let the host put in the window (read, list) or take from it (write).
    let limit = match call {
        FileCall::Pread { len, .. } => Some((*len).min(window.size) as i64),
        FileCall::Getdents { .. } => Some(window.size as i64),
        FileCall::Pwrite { data, .. } => Some(data.len() as i64),
        _ => None,
    };
    match answer {
        HostAnswer::Result(result) if result < 0 => match result.checked_neg() {
            Some(errno @ 1..=MAX_FUSE_ERRNO) => Ok(Checked::Reply(FileAnswer::Error(errno as i32))),
            _ => Err(format!("the host answered {result}, which is no errno")),
        },
        HostAnswer::Result(count) => match (call, limit) {
            (FileCall::Stat { .. }, _) => Err(format!("the host answered a value ({count}) instead of attributes")),
            (_, Some(limit)) if count > limit => Err(format!("the host answered {count} bytes where at most {limit} were asked")),
            (FileCall::Pread { .. } | FileCall::Getdents { .. }, _) => Ok(Checked::Read(count as u64)),
            _ => u32::try_from(count)
                .map(|value| Checked::Reply(FileAnswer::Value(value)))
                .map_err(|_| format!("the host answered {count}, out of range")),
        },
        HostAnswer::Attributes(attributes) if matches!(call, FileCall::Stat { .. }) => {
            Ok(Checked::Reply(FileAnswer::Attributes(attributes)))
        }
        HostAnswer::Attributes(_) => Err("the host answered attributes to a call that asked none".into()),
    }
}

/// A forwarded file call on its way: the request number it went out with, and when.
struct Outstanding {
    request: u32,
    forwarded: Forwarded,
    sent: Instant,
    /// Whether the host was told this call is slow.
    reported: bool,
}

/// A file call with the host this long is worth a line in the enclave's log.
const SLOW_FILE_CALL: Duration = Duration::from_secs(10);

/// How long a message the host started may take to arrive in full, and how long a full ring
/// may stay full, before the channel is judged broken (the daemon uses the same 5 s).
const STALL_LIMIT: Duration = Duration::from_secs(5);

/// What the loop does after one message.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Continue,
    /// The host asked the machine to stop; every job has been ended.
    Shutdown,
}

pub struct Session<M> {
    endpoint: Endpoint,
    memory: Arc<M>,
    frame: Vec<u8>,
    assembly: Box<[u8]>,
    encoded: Vec<u8>,
    jobs: HashMap<u32, Job>,
    events: mpsc::Receiver<Event>,
    events_to: Waking<Event>,
    settings: job::Settings,
    /// The jobs' host files: calls from their FUSE threads, served one at a time (they share
    /// the window), and the one the host has now.
    window: Option<FileWindow>,
    calls: mpsc::Receiver<Forwarded>,
    calls_to: Waking<Forwarded>,
    waiting_calls: VecDeque<Forwarded>,
    outstanding: Option<Outstanding>,
    next_request: u32,
    /// The XEMEM keeper's registry: where the daemon's XEMEM events (SIGBUS for attachers of a
    /// revoked placement, signals for guest owners) are carried out.
    xemem: Option<Arc<crate::xemem_keeper::Registry>>,
}

impl<M: PhysicalMemory + Send + Sync + 'static> Session<M> {
    /// A session; `window` set, each job runs in a view of its owner's host files. The calling
    /// thread is the one jobs and file calls wake (it polls).
    pub fn new(endpoint: Endpoint, memory: M, settings: job::Settings, window: Option<FileWindow>) -> Session<M> {
        let frame = vec![0; endpoint.max_message_len()];
        let (events_to, events) = mpsc::channel();
        let (calls_to, calls) = mpsc::channel();
        let (events_to, calls_to) = (Waking::to_this_thread(events_to), Waking::to_this_thread(calls_to));
        Session {
            endpoint,
            memory: Arc::new(memory),
            frame,
            assembly: vec![0; MAX_MESSAGE_LEN].into_boxed_slice(),
            encoded: vec![0; MAX_MESSAGE_LEN],
            jobs: HashMap::new(),
            events,
            events_to,
            settings,
            window,
            calls,
            calls_to,
            waiting_calls: VecDeque::new(),
            outstanding: None,
            next_request: 1,
            xemem: None,
        }
    }

    /// Carries the daemon's XEMEM events out through the keeper's `registry`.
    pub fn deliver_xemem_to(&mut self, registry: Arc<crate::xemem_keeper::Registry>) {
        self.xemem = Some(registry);
    }

    pub fn hello(&mut self, vcpus: u16, memory: u64) -> Result<(), String> {
        self.send(&EnclaveMessage::Hello { version: PROTOCOL_VERSION, vcpus, memory })
    }

    pub fn log(&mut self, text: &str) -> Result<(), String> {
        self.send(&EnclaveMessage::Log { text: text.as_bytes() })
    }

    fn send(&mut self, message: &EnclaveMessage<'_>) -> Result<(), String> {
        let length = message.encode(&mut self.encoded).map_err(|e| format!("encoding {message:?}: {e}"))?;
        let mut fragmenter = Fragmenter::new(&self.encoded[..length], self.frame.len()).map_err(|e| format!("framing: {e}"))?;
        while let Some(frame_len) = fragmenter.next_frame(&mut self.frame) {
            let deadline = Instant::now() + STALL_LIMIT;
            loop {
                match self.endpoint.send(&self.frame[..frame_len]) {
                    Ok(()) => break,
                    Err(SendError::Full) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(500)),
                    Err(SendError::Full) => return Err("the host did not drain the channel for 5 s".into()),
                    Err(e) => return Err(format!("channel: {e}")),
                }
            }
        }
        Ok(())
    }

    /// The next whole message from the host, if one has started; `Ok(None)` when the ring is
    /// empty or a malformed frame was dropped (and logged to the host).
    fn receive(&mut self) -> Result<Option<Vec<u8>>, String> {
        let mut reassembler = Reassembler::new(&mut self.assembly);
        let mut started: Option<Instant> = None;
        loop {
            let length = match self.endpoint.recv(&mut self.frame) {
                Ok(Some(length)) => length,
                Ok(None) => match started {
                    None => return Ok(None),
                    Some(at) if at.elapsed() > STALL_LIMIT => return Err("the host started a message and did not finish it".into()),
                    Some(_) => {
                        std::thread::sleep(Duration::from_micros(200));
                        continue;
                    }
                },
                Err(RecvError::BufferTooSmall { needed }) => return Err(format!("channel frame of {needed} bytes exceeds the slot")),
                Err(RecvError::Corrupt(corruption)) => return Err(format!("channel corrupted by the host: {corruption}")),
            };
            match reassembler.push(&self.frame[..length]) {
                Ok(Some(message)) => return Ok(Some(message.to_vec())),
                Ok(None) => {
                    started.get_or_insert_with(Instant::now);
                }
                Err(error) => {
                    let text = format!("agent: malformed frame from the host ({error}); dropped");
                    self.log(&text)?;
                    return Ok(None);
                }
            }
        }
    }

    /// One round: every message waiting from the host, then every job event. Returns whether
    /// anything happened (the caller sleeps a little when nothing did).
    pub fn poll(&mut self) -> Result<(bool, Next), String> {
        let mut busy = false;
        while let Some(bytes) = self.receive()? {
            busy = true;
            if self.handle(&bytes)? == Next::Shutdown {
                return Ok((true, Next::Shutdown));
            }
        }
        while let Ok(event) = self.events.try_recv() {
            busy = true;
            self.report(event)?;
        }
        self.waiting_calls.extend(self.calls.try_iter());
        if let Some(slow) = self.outstanding.as_mut().filter(|o| !o.reported && o.sent.elapsed() > SLOW_FILE_CALL) {
            slow.reported = true;
            let text = format!(
                "agent: job {}'s file call {} ({:?}) has waited {} s for the host; {} more queued",
                slow.forwarded.job,
                slow.request,
                slow.forwarded.call,
                slow.sent.elapsed().as_secs(),
                self.waiting_calls.len()
            );
            self.log(&text)?;
        }
        if self.outstanding.is_none() {
            if let Some(forwarded) = self.waiting_calls.pop_front() {
                busy = true;
                self.forward(forwarded)?;
            }
        }
        Ok((busy, Next::Continue))
    }

    fn handle(&mut self, bytes: &[u8]) -> Result<Next, String> {
        let message = match HostMessage::decode(bytes) {
            Ok(message) => message,
            Err(e) => {
                self.log(&format!("agent: malformed message from the host ({e}); ignored"))?;
                return Ok(Next::Continue);
            }
        };
        match message {
            HostMessage::Ping { nonce } => self.send(&EnclaveMessage::Pong { nonce })?,
            HostMessage::LaunchJob(launch) => {
                let job = launch.job;
                let started = if self.jobs.contains_key(&job) {
                    Err((libc::EEXIST, format!("job {job} is already running")))
                } else {
                    let host_files = self.window.map(|window| Forwarder { window: window.size, calls: self.calls_to.clone() });
                    job::start(&launch, self.memory.clone(), &self.settings, self.events_to.clone(), host_files)
                };
                // A started job says so (`Event::Started`) once its process runs.
                match started {
                    Ok(running) => {
                        self.jobs.insert(job, running);
                    }
                    Err((errno, reason)) => self.send(&EnclaveMessage::LaunchFailed { job, errno, reason: reason.as_bytes() })?,
                }
            }
            HostMessage::SignalJob { job, signal } => self.signal(job, signal as i32)?,
            HostMessage::KillJob { job } => self.signal(job, libc::SIGKILL)?,
            HostMessage::FileResult { job, request, result } => self.answered(job, request, HostAnswer::Result(result))?,
            HostMessage::FileAttributes { job, request, attributes } => self.answered(job, request, HostAnswer::Attributes(attributes))?,
            HostMessage::Shutdown => {
                for job in self.jobs.values() {
                    job.signal(libc::SIGKILL);
                }
                return Ok(Next::Shutdown);
            }
            HostMessage::Xemem { message } => match (xemem::pci::GuestEvent::from_bytes(message), &self.xemem) {
                (Some(event), Some(registry)) => {
                    registry.deliver(event, &crate::xemem_keeper::System);
                }
                (Some(event), None) => self.log(&format!("agent: {event:?} with no XEMEM keeper; ignored"))?,
                (None, _) => self.log(&format!("agent: a malformed XEMEM event ({} bytes); ignored", message.len()))?,
            },
            other => self.log(&format!("agent: {other:?} is not served in a Linux enclave; ignored"))?,
        }
        Ok(Next::Continue)
    }

    fn signal(&mut self, job: u32, signal: i32) -> Result<(), String> {
        match self.jobs.get(&job) {
            Some(running) => {
                running.signal(signal);
                Ok(())
            }
            None => self.log(&format!("agent: signal {signal} for job {job}, which is not running; ignored")),
        }
    }

    /// Sends one job's file call to the host; a call that cannot be put as a request fails
    /// at once.
    fn forward(&mut self, forwarded: Forwarded) -> Result<(), String> {
        let Some(window) = self.window else {
            let _ = forwarded.answer.send(FileAnswer::Error(libc::ENOSYS));
            return Ok(());
        };
        let request = self.next_request;
        self.next_request = self.next_request.wrapping_add(1).max(1);
        let op = match &forwarded.call {
            FileCall::Stat { path } => FileOp::Stat { path },
            FileCall::Open { path, flags, mode } => FileOp::Open { path, flags: *flags, mode: *mode },
            FileCall::Pread { handle, len, offset } => {
                FileOp::Pread { handle: *handle, gpa: window.gpa, len: (*len).min(window.size), offset: *offset }
            }
            FileCall::Pwrite { handle, offset, data } => {
                let len = u32::try_from(data.len()).ok().filter(|&len| len <= window.size);
                let placed = len.ok_or_else(|| format!("a {}-byte write exceeds the file window", data.len()));
                match placed.and_then(|len| self.memory.write(window.gpa, data).map(|()| len)) {
                    Ok(len) => FileOp::Pwrite { handle: *handle, gpa: window.gpa, len, offset: *offset },
                    Err(e) => {
                        let _ = forwarded.answer.send(FileAnswer::Error(libc::EIO));
                        return self.log(&format!("agent: job {}'s write: {e}", forwarded.job));
                    }
                }
            }
            FileCall::Getdents { handle } => FileOp::Getdents { handle: *handle, gpa: window.gpa, len: window.size },
            FileCall::Close { handle } => FileOp::Close { handle: *handle },
            FileCall::Ftruncate { handle, length } => FileOp::Ftruncate { handle: *handle, length: *length },
            FileCall::Unlink { path } => FileOp::Unlink { path },
            FileCall::Mkdir { path, mode } => FileOp::Mkdir { path, mode: *mode },
            FileCall::Rmdir { path } => FileOp::Rmdir { path },
            FileCall::Rename { from, to } => FileOp::Rename { from, to },
        };
        let message = EnclaveMessage::FileRequest { job: forwarded.job, request, op };
        if let Err(e) = self.send(&message) {
            let _ = forwarded.answer.send(FileAnswer::Error(libc::EIO));
            return Err(e);
        }
        self.outstanding = Some(Outstanding { request, forwarded, sent: Instant::now(), reported: false });
        Ok(())
    }

    /// The host's answer to a file call; data the call read is copied out of the window. The
    /// answer is checked against the call before it reaches the job's FUSE mount (the guest
    /// kernel's page cache, where a wrong read would stay for the job's life): it must answer
    /// the call with the host now (job and request number), in the call's kind, with an errno
    /// FUSE can carry, and no more bytes than were asked (read, listed or written). Anything
    /// else fails the call with EIO and is logged with what was wrong.
    fn answered(&mut self, job: u32, request: u32, answer: HostAnswer) -> Result<(), String> {
        let matches = self.outstanding.as_ref().is_some_and(|o| o.request == request && o.forwarded.job == job);
        let (Some(window), true) = (self.window, matches) else {
            return self.log(&format!("agent: an answer to file call {request} of job {job}, which was not asked; ignored"));
        };
        let Outstanding { forwarded, .. } = self.outstanding.take().expect("matched");
        let reply = match checked_answer(&forwarded.call, window, answer) {
            Ok(Checked::Reply(reply)) => reply,
            Ok(Checked::Read(count)) => match self.memory.read(window.gpa, count) {
                Ok(data) if data.len() as u64 == count => FileAnswer::Data(data),
                Ok(data) => {
                    self.log(&format!("agent: the file window gave {} bytes for {count}", data.len()))?;
                    FileAnswer::Error(libc::EIO)
                }
                Err(e) => {
                    self.log(&format!("agent: reading the file window: {e}"))?;
                    FileAnswer::Error(libc::EIO)
                }
            },
            Err(wrong) => {
                self.log(&format!("agent: job {job}'s file call {request} ({:?}): {wrong}; failed with EIO", forwarded.call))?;
                FileAnswer::Error(libc::EIO)
            }
        };
        // The FUSE thread may have given up waiting; its call then failed already.
        let _ = forwarded.answer.send(reply);
        Ok(())
    }

    fn report(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Started { job } => self.send(&EnclaveMessage::JobStarted { job })?,
            Event::Failed { job, errno, reason } => {
                self.jobs.remove(&job);
                self.send(&EnclaveMessage::LaunchFailed { job, errno, reason: reason.as_bytes() })?;
            }
            Event::Output { job, stream, data } => {
                let chunk = max_output_chunk(self.frame.len()).max(1);
                for piece in data.chunks(chunk) {
                    self.send(&EnclaveMessage::JobOutput { job, stream, data: piece })?;
                }
            }
            Event::Exited { job, status } => {
                // Output the job wrote before it ended is already queued ahead of this event.
                self.jobs.remove(&job);
                self.send(&EnclaveMessage::JobExited { job, status })?;
            }
        }
        Ok(())
    }

    /// Whether a file call is with the host, whose answer the loop should look for soon.
    pub fn awaiting_host(&self) -> bool {
        self.outstanding.is_some()
    }

    /// The way a job's FUSE thread reaches the host, as a job with host files gets it.
    #[cfg(test)]
    pub fn forwarder(&self) -> Option<Forwarder> {
        self.window.map(|window| Forwarder { window: window.size, calls: self.calls_to.clone() })
    }

    /// Jobs still running.
    #[cfg(test)]
    pub fn running_jobs(&self) -> usize {
        self.jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: FileWindow = FileWindow { gpa: 0x7000_0000, size: 256 << 10 };

    fn check(call: FileCall, answer: HostAnswer) -> Result<Checked, String> {
        checked_answer(&call, WINDOW, answer)
    }

    fn pread(len: u32) -> FileCall {
        FileCall::Pread { handle: 1, len, offset: 0 }
    }

    #[test]
    fn reads_get_no_more_bytes_than_they_asked() {
        assert_eq!(check(pread(100), HostAnswer::Result(100)), Ok(Checked::Read(100)));
        assert_eq!(check(pread(100), HostAnswer::Result(0)), Ok(Checked::Read(0)));
        let more = check(pread(100), HostAnswer::Result(101)).unwrap_err();
        assert_eq!(more, "the host answered 101 bytes where at most 100 were asked");
        // A read asks at most the window, whatever the kernel asked.
        assert!(check(pread(1 << 30), HostAnswer::Result((256 << 10) + 1)).is_err());
        let listing = FileCall::Getdents { handle: 1 };
        assert_eq!(check(listing.clone(), HostAnswer::Result(256 << 10)), Ok(Checked::Read(256 << 10)));
        assert!(check(listing, HostAnswer::Result((256 << 10) + 1)).is_err());
        let write = FileCall::Pwrite { handle: 1, offset: 0, data: vec![7; 10] };
        assert_eq!(check(write.clone(), HostAnswer::Result(10)), Ok(Checked::Reply(FileAnswer::Value(10))));
        assert!(check(write, HostAnswer::Result(11)).is_err(), "more written than sent");
    }

    #[test]
    fn only_errnos_fuse_can_carry_are_passed_on() {
        assert_eq!(check(pread(10), HostAnswer::Result(-2)), Ok(Checked::Reply(FileAnswer::Error(libc::ENOENT))));
        assert_eq!(check(pread(10), HostAnswer::Result(-511)), Ok(Checked::Reply(FileAnswer::Error(511))));
        for wrong in [-512, -100_000, i64::MIN] {
            assert_eq!(check(pread(10), HostAnswer::Result(wrong)), Err(format!("the host answered {wrong}, which is no errno")));
        }
    }

    #[test]
    fn answers_of_the_wrong_kind_are_refused() {
        let stat = || FileCall::Stat { path: b"/x".to_vec() };
        let open = FileCall::Open { path: b"/x".to_vec(), flags: 0, mode: 0 };
        assert!(matches!(check(stat(), HostAnswer::Attributes(Default::default())), Ok(Checked::Reply(FileAnswer::Attributes(_)))));
        assert!(check(stat(), HostAnswer::Result(0)).is_err(), "a stat needs attributes");
        assert!(check(open.clone(), HostAnswer::Attributes(Default::default())).is_err());
        assert!(check(pread(10), HostAnswer::Attributes(Default::default())).is_err());
        assert_eq!(check(open.clone(), HostAnswer::Result(5)), Ok(Checked::Reply(FileAnswer::Value(5))));
        assert!(check(open, HostAnswer::Result(1 << 40)).is_err(), "no handle that large");
    }
}
