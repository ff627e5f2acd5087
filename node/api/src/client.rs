//! A client of clowderd: connect, send a request (with descriptors), read the job events that
//! come before the reply, and the reply, raw or typed.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::codec::{Limits, LineSocket};
use crate::daemon::{socket_path, JobEvent, Request, MAX_REPLY_LEN, MAX_REQUEST_FDS};
use crate::{parse_reply, ApiError};

/// Why a call gave no reply body: the daemon could not be reached or answered with an error.
#[derive(Debug)]
pub enum CallError {
    /// Talking to the daemon failed; the sentence says what to do.
    Transport(String),
    /// The daemon refused or failed the request.
    Api(ApiError),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Transport(message) => f.write_str(message),
            CallError::Api(error) => f.write_str(&error.message),
        }
    }
}

impl std::error::Error for CallError {}

/// What a client takes from the daemon.
const CLIENT_LIMITS: Limits = Limits { max_line: MAX_REPLY_LEN, max_fds: MAX_REQUEST_FDS, timeout: None };

pub struct Client {
    socket: LineSocket,
}

impl Client {
    /// Connects to the daemon at `CLOWDER_SOCKET` or the default path; the error says how to
    /// start the daemon.
    pub fn connect() -> Result<Client, String> {
        Client::connect_to(&socket_path())
    }

    pub fn connect_to(path: &Path) -> Result<Client, String> {
        match UnixStream::connect(path) {
            Ok(stream) => Ok(Client { socket: LineSocket::new(stream, CLIENT_LIMITS) }),
            Err(e) => Err(not_running(path, &e)),
        }
    }

    /// Sends a request (any JSON: tests send malformed ones on purpose) and returns the final
    /// reply line (the one with `ok`) as it came; lines before it (job events) go to `on_event`.
    pub fn call_streaming(&mut self, request: &impl Serialize, fds: &[RawFd], on_event: &mut dyn FnMut(&Value)) -> Result<Value, String> {
        self.socket.send(request, fds).map_err(|e| format!("sending to clowderd: {e}"))?;
        loop {
            match self.socket.receive_json::<Value>() {
                Ok(Some((value, _))) if value.get("ok").is_some() => return Ok(value),
                Ok(Some((event, _))) => on_event(&event),
                Ok(None) => return Err("clowderd closed the connection before answering (did it exit? see its log)".into()),
                Err(e) => return Err(format!("reading clowderd's answer: {e}")),
            }
        }
    }

    /// [`Client::call_streaming`] for a request without descriptors or events.
    pub fn call(&mut self, request: &impl Serialize) -> Result<Value, String> {
        self.call_streaming(request, &[], &mut |_| {})
    }

    /// Sends a typed request and returns its typed reply; events go to `on_event` typed (an
    /// event this client does not know, from a newer daemon, is skipped), and `on_raw` sees
    /// every line (events, then the reply) as it came.
    pub fn request_streaming<R: DeserializeOwned>(
        &mut self,
        request: &Request,
        fds: &[RawFd],
        on_event: &mut dyn FnMut(JobEvent),
        on_raw: &mut dyn FnMut(&Value),
    ) -> Result<R, CallError> {
        let reply = self
            .call_streaming(request, fds, &mut |value| {
                on_raw(value);
                if let Ok(event) = serde_json::from_value::<JobEvent>(value.clone()) {
                    on_event(event);
                }
            })
            .map_err(CallError::Transport)?;
        on_raw(&reply);
        parse_reply(reply).map_err(CallError::Api)
    }

    /// Sends a typed request without descriptors and returns its typed reply.
    pub fn request<R: DeserializeOwned>(&mut self, request: &Request) -> Result<R, CallError> {
        self.request_streaming(request, &[], &mut |_| {}, &mut |_| {})
    }
}

fn not_running(path: &Path, error: &io::Error) -> String {
    let how = match error.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => "clowderd is not running",
        io::ErrorKind::PermissionDenied => "you may not open clowderd's socket",
        _ => "cannot reach clowderd",
    };
    format!(
        "{how} ({}: {error}).\nStart it as root with: clowderd &   (or: sudo target/release/clowderd &)\n\
         A daemon on another socket is reached with CLOWDER_SOCKET=PATH.",
        path.display()
    )
}
