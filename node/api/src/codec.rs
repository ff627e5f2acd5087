//! Framed JSON over a Unix stream socket: one JSON value per line, file descriptors riding
//! along (SCM_RIGHTS) on the same line. clowderd's API socket and the VMM's control socket
//! both speak it, with their own [`Limits`].
//!
//! One message carries at most [`FDS_PER_MESSAGE`] descriptors, so a line with more is sent in
//! pieces, each piece of the line taking the next batch; the receiver gathers every batch that
//! arrives before the newline. What one line may hold is capped on the receiving side (bytes,
//! descriptors, time), so no peer makes the reader buffer without bound or wait for ever.

use std::fmt;
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Descriptors sent or received with one message: the receiver's buffer holds this many, and
/// a sender splits larger sets over several pieces of the line.
pub const FDS_PER_MESSAGE: usize = 32;

/// What one received line may hold, and how long it may take to arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest line taken, in bytes.
    pub max_line: usize,
    /// Most descriptors one line may carry.
    pub max_fds: usize,
    /// How long one whole line may take to arrive, from the moment `receive` starts waiting;
    /// `None` waits as long as the peer takes.
    pub timeout: Option<Duration>,
}

/// Why no line could be read. After any of these but `Io`, the stream is out of step (part of
/// a line was dropped), so the connection should be closed.
#[derive(Debug)]
pub enum ReceiveError {
    /// The line grew past the socket's limit, this many bytes.
    TooLong(usize),
    /// The line carried more than this many descriptors, or one message more than
    /// [`FDS_PER_MESSAGE`] (the kernel then closes them and drops the bytes they came with).
    TooManyFds(usize),
    /// No complete line arrived within the socket's timeout.
    TimedOut(Duration),
    /// Something else went wrong on the socket (the peer reset it, ...).
    Io(io::Error),
}

impl fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReceiveError::TooLong(limit) => write!(f, "line longer than {limit} bytes; closing the connection"),
            ReceiveError::TooManyFds(limit) => write!(
                f,
                "request carries more than {limit} file descriptors, or more than {FDS_PER_MESSAGE} on one message; \
                 closing the connection"
            ),
            ReceiveError::TimedOut(limit) => {
                write!(f, "no complete request within {} s; closing the idle connection", limit.as_secs_f64())
            }
            ReceiveError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReceiveError {}

/// A line, without its newline, and the descriptors that came with it.
pub type LineWithFiles = (Vec<u8>, Vec<File>);

pub struct LineSocket {
    stream: UnixStream,
    pending: Vec<u8>,
    /// How much of `pending` holds no newline: a long line is searched once, not once per
    /// `recvmsg` (an `add_pieces` line of the VMM's control socket runs to megabytes).
    searched: usize,
    limits: Limits,
}

impl LineSocket {
    pub fn new(stream: UnixStream, limits: Limits) -> LineSocket {
        LineSocket { stream, pending: Vec::new(), searched: 0, limits }
    }

    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// The next line and the descriptors that came with it; `None` at end of stream.
    pub fn receive(&mut self) -> Result<Option<LineWithFiles>, ReceiveError> {
        let deadline = self.limits.timeout.map(|timeout| (Instant::now() + timeout, timeout));
        let mut files = Vec::new();
        loop {
            if let Some(position) = self.pending[self.searched..].iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=self.searched + position).collect();
                line.pop();
                self.searched = 0;
                return Ok(Some((line, files)));
            }
            self.searched = self.pending.len();
            if self.pending.len() > self.limits.max_line {
                self.pending = Vec::new();
                self.searched = 0;
                return Err(ReceiveError::TooLong(self.limits.max_line));
            }
            if let Some((deadline, timeout)) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !self.wait_readable(left).map_err(ReceiveError::Io)? {
                    // A wait cut short by a signal says no too: only the deadline ends it.
                    if Instant::now() >= deadline {
                        return Err(ReceiveError::TimedOut(timeout));
                    }
                    continue;
                }
            }
            let count = self.receive_some(&mut files)?;
            if files.len() > self.limits.max_fds {
                return Err(ReceiveError::TooManyFds(self.limits.max_fds));
            }
            if count == 0 {
                return Ok(None);
            }
        }
    }

    /// One `recvmsg`: its bytes go to `pending`, its descriptors to `files`.
    fn receive_some(&mut self, files: &mut Vec<File>) -> Result<usize, ReceiveError> {
        let mut buffer = [0u8; 8192];
        let mut space = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
        let mut iov = [IoSliceMut::new(&mut buffer)];
        let message = loop {
            match recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other.map_err(|e| ReceiveError::Io(e.into()))?,
            }
        };
        for control in message.cmsgs().map_err(|e| ReceiveError::Io(e.into()))? {
            if let ControlMessageOwned::ScmRights(fds) = control {
                // SAFETY: descriptors just received belong to nobody else.
                files.extend(fds.into_iter().map(|fd| unsafe { File::from_raw_fd(fd) }));
            }
        }
        if message.flags.contains(MsgFlags::MSG_CTRUNC) {
            // The kernel closed the descriptors that did not fit; the line is out of step.
            return Err(ReceiveError::TooManyFds(self.limits.max_fds));
        }
        let count = message.bytes;
        self.pending.extend_from_slice(&buffer[..count]);
        Ok(count)
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX)) {
            Ok(ready) => Ok(ready > 0),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends `value` as one line; descriptors go [`FDS_PER_MESSAGE`] at a time, each batch on
    /// its own byte of the line (a line is never shorter than its batches: `{}` plus a newline
    /// holds three, and a line carrying descriptors names them).
    pub fn send(&self, value: &impl Serialize, fds: &[RawFd]) -> io::Result<()> {
        let mut line = serde_json::to_vec(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        line.push(b'\n');
        let batches: Vec<&[RawFd]> = fds.chunks(FDS_PER_MESSAGE).collect();
        if batches.len() > line.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors cannot ride on one line", fds.len())));
        }
        let mut start = 0;
        for (index, batch) in batches.iter().enumerate() {
            // The last batch takes the rest of the line; each earlier one a single byte.
            let end = if index + 1 == batches.len() { line.len() } else { start + 1 };
            let sent = sendmsg::<()>(
                self.stream.as_raw_fd(),
                &[IoSlice::new(&line[start..end])],
                &[ControlMessage::ScmRights(batch)],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)?;
            if index + 1 < batches.len() && sent != 1 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "sending a batch of descriptors"));
            }
            start += sent;
        }
        (&self.stream).write_all(&line[start..])
    }

    /// Whether the peer has closed the connection (checked while a job is quiet).
    pub fn peer_hung_up(&self) -> bool {
        // nix knows no POLLRDHUP (the peer shut its writing side), so this polls with libc.
        let mut poll = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one pollfd we own, for a descriptor we hold.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Reads the next line as JSON of type `T`, with its descriptors.
    pub fn receive_json<T: DeserializeOwned>(&mut self) -> Result<Option<(T, Vec<File>)>, ReceiveError> {
        match self.receive()? {
            None => Ok(None),
            Some((line, files)) => serde_json::from_slice(&line)
                .map(|value| Some((value, files)))
                .map_err(|e| ReceiveError::Io(io::Error::new(io::ErrorKind::InvalidData, e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: Limits = Limits { max_line: 1024, max_fds: 130, timeout: Some(Duration::from_secs(10)) };

    fn pair(limits: Limits) -> (LineSocket, LineSocket) {
        let (a, b) = UnixStream::pair().unwrap();
        (LineSocket::new(a, LIMITS), LineSocket::new(b, limits))
    }

    #[test]
    fn more_descriptors_than_one_message_holds_arrive_with_their_line() {
        let (sender, mut receiver) = pair(LIMITS);
        let files: Vec<File> = (0..FDS_PER_MESSAGE * 2 + 5).map(|_| File::open("/dev/null").unwrap()).collect();
        let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        sender.send(&json!({"op": "run"}), &fds).unwrap();
        sender.send(&json!({"op": "ls"}), &[]).unwrap();
        let (line, received) = receiver.receive().unwrap().unwrap();
        assert_eq!(line, br#"{"op":"run"}"#);
        assert_eq!(received.len(), fds.len());
        let (line, received) = receiver.receive().unwrap().unwrap();
        assert_eq!((line.as_slice(), received.len()), (&br#"{"op":"ls"}"#[..], 0));
    }

    #[test]
    fn more_descriptors_than_the_limit_are_refused() {
        let (sender, mut receiver) = pair(Limits { max_fds: 4, ..LIMITS });
        let files: Vec<File> = (0..5).map(|_| File::open("/dev/null").unwrap()).collect();
        let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        sender.send(&json!({"op": "add_region"}), &fds).unwrap();
        assert!(matches!(receiver.receive(), Err(ReceiveError::TooManyFds(4))));
    }

    #[test]
    fn a_long_line_is_searched_once_and_the_next_line_follows_it() {
        let long = Limits { max_line: 64 << 20, ..LIMITS };
        let (sender, mut receiver) = pair(long);
        let sender = std::thread::spawn(move || {
            sender.send(&json!({ "pieces": vec![[1u64 << 40, 4096]; 1 << 20] }), &[]).unwrap();
            sender.send(&json!({"op": "next"}), &[]).unwrap();
        });
        // Searched from the start on every 8 KiB received, these 22 MB took 8.9 s (0.3 s now;
        // a target for a benchmark, not a timed test: this checks the line and the next one).
        let (line, _) = receiver.receive().unwrap().unwrap();
        assert_eq!(line.len(), 12 + (1 << 20) * 21);
        assert_eq!(receiver.receive().unwrap().unwrap().0, br#"{"op":"next"}"#);
        sender.join().unwrap();
    }

    #[test]
    fn a_line_over_the_cap_is_refused_without_buffering_it_all() {
        let (sender, mut receiver) = pair(LIMITS);
        let writer = std::thread::spawn(move || {
            // Never a newline: the reader must give up at the cap, not wait for one.
            let chunk = vec![b'x'; 64 * 1024];
            while (&sender.stream).write_all(&chunk).is_ok() {}
        });
        assert!(matches!(receiver.receive(), Err(ReceiveError::TooLong(1024))));
        drop(receiver);
        writer.join().unwrap();
    }

    #[test]
    fn a_line_that_trickles_in_times_out() {
        let (sender, mut receiver) = pair(Limits { timeout: Some(Duration::from_millis(300)), ..LIMITS });
        let writer = std::thread::spawn(move || {
            for _ in 0..20 {
                if (&sender.stream).write_all(b"{").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        assert!(matches!(receiver.receive(), Err(ReceiveError::TimedOut(_))));
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
        writer.join().unwrap();
    }

    #[test]
    fn a_closed_peer_is_noticed() {
        let (sender, receiver) = pair(LIMITS);
        assert!(!receiver.peer_hung_up());
        drop(sender);
        assert!(receiver.peer_hung_up());
    }
}
