//! JSON lines over a Unix stream socket, with file descriptors riding along (SCM_RIGHTS) on
//! the same message as their line. Shared by the daemon and its clients.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use serde_json::Value;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::api::MAX_REQUEST_LEN;

/// Descriptors accepted with one line (a job's binary, its directory and its input files).
pub const MAX_FDS: usize = 32;

pub struct LineSocket {
    stream: UnixStream,
    pending: Vec<u8>,
    /// Set after an over-long line: the rest of it is skipped up to its newline.
    discarding: bool,
}

impl LineSocket {
    pub fn new(stream: UnixStream) -> LineSocket {
        LineSocket { stream, pending: Vec::new(), discarding: false }
    }

    /// The next line and the descriptors that came with it; `None` at end of stream. A line
    /// longer than the limit is an `InvalidData` error, after which reading resumes at the
    /// next line.
    pub fn receive(&mut self) -> io::Result<Option<(Vec<u8>, Vec<File>)>> {
        let mut files = Vec::new();
        loop {
            if let Some(position) = self.pending.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=position).collect();
                line.pop();
                if std::mem::take(&mut self.discarding) {
                    continue;
                }
                return Ok(Some((line, files)));
            }
            if self.pending.len() > MAX_REQUEST_LEN {
                self.pending.clear();
                if !self.discarding {
                    self.discarding = true;
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("request longer than {MAX_REQUEST_LEN} bytes"),
                    ));
                }
            }
            let mut buffer = [0u8; 8192];
            let mut fds = [-1 as RawFd; MAX_FDS];
            let mut iov = [libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() }];
            // SAFETY: the iovec points at `buffer`, which outlives the call.
            let (count, fd_count) = unsafe { self.stream.recv_with_fds(&mut iov, &mut fds) }.map_err(io::Error::from)?;
            for fd in &fds[..fd_count] {
                // SAFETY: descriptors just received belong to nobody else.
                files.push(unsafe { File::from_raw_fd(*fd) });
            }
            if count == 0 {
                return Ok(None);
            }
            self.pending.extend_from_slice(&buffer[..count]);
        }
    }

    /// Sends one line, with descriptors attached to its first byte.
    pub fn send(&self, value: &Value, fds: &[RawFd]) -> io::Result<()> {
        let mut line = value.to_string().into_bytes();
        line.push(b'\n');
        if fds.is_empty() {
            return (&self.stream).write_all(&line);
        }
        let sent = self.stream.send_with_fds(&[&line[..]], fds).map_err(io::Error::from)?;
        (&self.stream).write_all(&line[sent..])
    }

    /// Whether the peer has closed the connection (checked while a job is quiet).
    pub fn peer_hung_up(&self) -> bool {
        crate::sys::peer_hung_up(self.stream.as_raw_fd())
    }

    /// Reads the next line as JSON.
    pub fn receive_value(&mut self) -> io::Result<Option<Value>> {
        match self.receive()? {
            None => Ok(None),
            Some((line, _)) => serde_json::from_slice(&line).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }
}
