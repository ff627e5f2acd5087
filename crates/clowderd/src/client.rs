//! A client of the daemon's API (the `clowder` CLI and tests use it).

use std::io;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde_json::Value;

use crate::api::socket_path;
use crate::jsonl::LineSocket;

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
            Ok(stream) => Ok(Client { socket: LineSocket::new(stream) }),
            Err(e) => Err(not_running(path, &e)),
        }
    }

    /// Sends a request and returns the final reply (the line with `ok`); lines before it
    /// (job events) go to `on_event`.
    pub fn call_streaming(&mut self, request: &Value, fds: &[RawFd], on_event: &mut dyn FnMut(&Value)) -> Result<Value, String> {
        self.socket.send(request, fds).map_err(|e| format!("sending to clowderd: {e}"))?;
        loop {
            match self.socket.receive_value() {
                Ok(Some(value)) if value.get("ok").is_some() => return Ok(value),
                Ok(Some(event)) => on_event(&event),
                Ok(None) => return Err("clowderd closed the connection before answering (did it exit? see its log)".into()),
                Err(e) => return Err(format!("reading clowderd's answer: {e}")),
            }
        }
    }

    pub fn call(&mut self, request: &Value) -> Result<Value, String> {
        self.call_streaming(request, &[], &mut |_| {})
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
