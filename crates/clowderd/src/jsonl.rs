//! JSON lines over a Unix stream socket, with file descriptors riding along (SCM_RIGHTS) on
//! the same line. Shared by the daemon and its clients.
//!
//! One message carries at most [`FDS_PER_MESSAGE`] descriptors, so a line with more is sent in
//! pieces, each piece of the line taking the next batch; the receiver gathers every batch that
//! arrives before the newline. What one line may hold is capped on the receiving side (bytes,
//! descriptors, time), so no peer makes the reader buffer without bound or wait for ever.

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::api::{MAX_REQUEST_FDS, MAX_REQUEST_LEN};

/// Longest line a client takes from the daemon (a `logs` reply of 2000 long lines fits).
pub const MAX_REPLY_LEN: usize = 64 << 20;

/// Descriptors sent or received with one message: the receiver's buffer holds this many, and
/// a sender splits larger sets over several pieces of the line.
pub const FDS_PER_MESSAGE: usize = 32;

/// Why no line could be read. After any of these but `Io`, the stream is out of step (part of
/// a line was dropped), so the connection should be closed.
#[derive(Debug)]
pub enum ReceiveError {
    /// The line grew past the socket's limit, this many bytes.
    TooLong(usize),
    /// The line carried more than [`MAX_REQUEST_FDS`] descriptors, or one message more than
    /// [`FDS_PER_MESSAGE`] (the kernel then closes them and drops the bytes they came with).
    TooManyFds,
    /// No complete line arrived within the socket's request timeout.
    TimedOut(Duration),
    /// Something else went wrong on the socket (the peer reset it, ...).
    Io(io::Error),
}

impl fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReceiveError::TooLong(limit) => write!(f, "line longer than {limit} bytes; closing the connection"),
            ReceiveError::TooManyFds => write!(
                f,
                "request carries more than {MAX_REQUEST_FDS} file descriptors, or more than {FDS_PER_MESSAGE} on one \
                 message; closing the connection"
            ),
            ReceiveError::TimedOut(limit) => {
                write!(f, "no complete request within {} s; closing the idle connection", limit.as_secs_f64())
            }
            ReceiveError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A line, without its newline, and the descriptors that came with it.
pub type LineWithFiles = (Vec<u8>, Vec<File>);

pub struct LineSocket {
    stream: UnixStream,
    pending: Vec<u8>,
    /// Longest line taken.
    max_line: usize,
    /// How long one whole line may take to arrive, from the moment `receive` starts waiting.
    request_timeout: Option<Duration>,
}

impl LineSocket {
    /// A client's socket: it takes replies up to [`MAX_REPLY_LEN`] and waits as long as the
    /// daemon takes.
    pub fn new(stream: UnixStream) -> LineSocket {
        LineSocket { stream, pending: Vec::new(), max_line: MAX_REPLY_LEN, request_timeout: None }
    }

    /// The daemon's socket to a client: it takes requests up to [`MAX_REQUEST_LEN`], and a
    /// line that takes longer than `timeout` to arrive (a peer that sends nothing, or trickles
    /// a line out) is a [`ReceiveError::TimedOut`].
    pub fn for_requests(stream: UnixStream, timeout: Duration) -> LineSocket {
        LineSocket { stream, pending: Vec::new(), max_line: MAX_REQUEST_LEN, request_timeout: Some(timeout) }
    }

    /// The next line and the descriptors that came with it; `None` at end of stream.
    pub fn receive(&mut self) -> Result<Option<LineWithFiles>, ReceiveError> {
        let deadline = self.request_timeout.map(|timeout| (Instant::now() + timeout, timeout));
        let mut files = Vec::new();
        loop {
            if let Some(position) = self.pending.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=position).collect();
                line.pop();
                return Ok(Some((line, files)));
            }
            if self.pending.len() > self.max_line {
                self.pending = Vec::new();
                return Err(ReceiveError::TooLong(self.max_line));
            }
            if let Some((deadline, timeout)) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !crate::sys::wait_readable(self.stream.as_raw_fd(), left).map_err(ReceiveError::Io)? {
                    // `wait_readable` also says no on EINTR: only the deadline ends the wait.
                    if Instant::now() >= deadline {
                        return Err(ReceiveError::TimedOut(timeout));
                    }
                    continue;
                }
            }
            let mut buffer = [0u8; 8192];
            let mut fds = [-1 as RawFd; FDS_PER_MESSAGE];
            let mut iov = [libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() }];
            // SAFETY: the iovec points at `buffer`, which outlives the call.
            let (count, fd_count) = match unsafe { self.stream.recv_with_fds(&mut iov, &mut fds) } {
                Ok(received) => received,
                // The kernel truncated the descriptors (and vmm-sys-util closed them).
                Err(e) if e.errno() == libc::ENOBUFS => return Err(ReceiveError::TooManyFds),
                Err(e) => return Err(ReceiveError::Io(e.into())),
            };
            for fd in &fds[..fd_count] {
                // SAFETY: descriptors just received belong to nobody else.
                files.push(unsafe { File::from_raw_fd(*fd) });
            }
            if files.len() > MAX_REQUEST_FDS {
                return Err(ReceiveError::TooManyFds);
            }
            if count == 0 {
                return Ok(None);
            }
            self.pending.extend_from_slice(&buffer[..count]);
        }
    }

    /// Sends one line; descriptors go [`FDS_PER_MESSAGE`] at a time, each batch on its own
    /// byte of the line (a line is never shorter than its batches: `{}` plus a newline holds
    /// three, and a line carrying descriptors names them).
    pub fn send(&self, value: &Value, fds: &[RawFd]) -> io::Result<()> {
        let mut line = value.to_string().into_bytes();
        line.push(b'\n');
        let batches: Vec<&[RawFd]> = fds.chunks(FDS_PER_MESSAGE).collect();
        if batches.len() > line.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors cannot ride on one line", fds.len())));
        }
        let mut start = 0;
        for (index, batch) in batches.iter().enumerate() {
            // The last batch takes the rest of the line; each earlier one a single byte.
            let end = if index + 1 == batches.len() { line.len() } else { start + 1 };
            let sent = self.stream.send_with_fds(&[&line[start..end]], batch).map_err(io::Error::from)?;
            if index + 1 < batches.len() && sent != 1 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "sending a batch of descriptors"));
            }
            start += sent;
        }
        (&self.stream).write_all(&line[start..])
    }

    /// Whether the peer has closed the connection (checked while a job is quiet).
    pub fn peer_hung_up(&self) -> bool {
        crate::sys::peer_hung_up(self.stream.as_raw_fd())
    }

    /// Reads the next line as JSON.
    pub fn receive_value(&mut self) -> Result<Option<Value>, ReceiveError> {
        match self.receive()? {
            None => Ok(None),
            Some((line, _)) => serde_json::from_slice(&line)
                .map(Some)
                .map_err(|e| ReceiveError::Io(io::Error::new(io::ErrorKind::InvalidData, e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A client's end and the daemon's.
    fn pair(timeout: Duration) -> (LineSocket, LineSocket) {
        let (a, b) = UnixStream::pair().unwrap();
        (LineSocket::new(a), LineSocket::for_requests(b, timeout))
    }

    #[test]
    fn more_descriptors_than_one_message_holds_arrive_with_their_line() {
        let (sender, mut receiver) = pair(Duration::from_secs(10));
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
    fn a_line_over_the_cap_is_refused_without_buffering_it_all() {
        let (sender, mut receiver) = pair(Duration::from_secs(10));
        let writer = std::thread::spawn(move || {
            // Never a newline: the reader must give up at the cap, not wait for one.
            let chunk = vec![b'x'; 64 * 1024];
            while (&sender.stream).write_all(&chunk).is_ok() {}
        });
        assert!(matches!(receiver.receive(), Err(ReceiveError::TooLong(MAX_REQUEST_LEN))));
        drop(receiver);
        writer.join().unwrap();
    }

    #[test]
    fn a_line_that_trickles_in_times_out() {
        let (sender, mut receiver) = pair(Duration::from_millis(300));
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
}
