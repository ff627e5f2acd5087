//! The daemon's socket: bind it, accept clients, one thread per connection. No client can stop
//! the accept loop: errors (out of descriptors, of threads) are waited out with back-off, each
//! user holds a bounded number of connections, the connections of all users but root together
//! are bounded, and a connection that sends no complete request in time, or reads nothing of
//! what it is sent for as long, is closed.

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clowder_api::codec::{Limits as LineLimits, LineSocket, ReceiveError};
use clowder_api::daemon::{JobEvent, Request, MAX_REQUEST_FDS, MAX_REQUEST_LEN};
use clowder_api::ErrorKind;

use crate::admission::{Admissions, Backoff, ConnectionLimits};
use crate::api::error_reply;
use crate::daemon::{Daemon, EventSink};
use crate::peer::{peer_of, Peer};

/// Binds the API socket. A live daemon already on the path is an error; a stale socket file
/// left by a dead one is replaced.
pub fn bind(path: &Path) -> Result<UnixListener, String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    if UnixStream::connect(path).is_ok() {
        return Err(format!("another clowderd is already listening on {}", path.display()));
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|e| format!("binding {}: {e}", path.display()))?;
    // Anyone may connect to list enclaves; privileged requests check the caller's credentials.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("setting permissions on {}: {e}", path.display()))?;
    Ok(listener)
}

/// How much of the daemon clients may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Open connections of one user (root is not limited).
    pub per_user: usize,
    /// Open connections of all users but root together.
    pub total: usize,
    /// How long a connection may take to send a whole request line (the idle timeout).
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { per_user: 32, total: 256, request_timeout: Duration::from_secs(60) }
    }
}

/// Serves clients for ever with the default [`Limits`].
pub fn serve(daemon: Arc<Daemon>, listener: UnixListener) -> ! {
    serve_with_limits(daemon, listener, Limits::default())
}

/// Serves clients for ever: no error of accept or of starting a thread ends the loop.
pub fn serve_with_limits(daemon: Arc<Daemon>, listener: UnixListener, limits: Limits) -> ! {
    let admissions = Admissions::new("clowderd", ConnectionLimits { per_user: limits.per_user, total: limits.total });
    let mut backoff = Backoff::new("the API socket");
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => continue,
            Err(e) => {
                backoff.failed("accepting a client", &e);
                continue;
            }
        };
        let peer = match peer_of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                refuse(stream, ErrorKind::Internal, &format!("cannot read your credentials: {e}"));
                continue;
            }
        };
        let admission = match admissions.admit(peer.uid) {
            Ok(admission) => admission,
            Err(why) => {
                refuse(stream, ErrorKind::Busy, &why);
                continue;
            }
        };
        let daemon = daemon.clone();
        let timeout = limits.request_timeout;
        let spawned = std::thread::Builder::new().name("client".into()).spawn(move || {
            let _admission = admission;
            serve_client(&daemon, stream, &peer, timeout);
        });
        match spawned {
            // The closure, and with it the connection, is dropped: the client sees it close.
            Err(e) => backoff.failed("starting a client thread", &e),
            Ok(_) => backoff.succeeded(),
        }
    }
}

/// Tells a client why it is not served and closes the connection, without waiting on it.
fn refuse(stream: UnixStream, kind: ErrorKind, why: &str) {
    let mut line = error_reply(kind, why).to_string();
    line.push('\n');
    // A new connection's send buffer is empty; should it not take the line, the client loses
    // only the reason.
    let _ = stream.set_nonblocking(true);
    let _ = (&stream).write_all(line.as_bytes());
}

/// Job events go to the client's connection.
struct ClientEvents<'a>(&'a LineSocket);

impl EventSink for ClientEvents<'_> {
    fn send(&mut self, event: &JobEvent) -> io::Result<()> {
        self.0.send(event, &[])
    }

    fn client_gone(&self) -> bool {
        self.0.peer_hung_up()
    }
}

fn serve_client(daemon: &Arc<Daemon>, stream: UnixStream, peer: &Peer, request_timeout: Duration) {
    // A client that reads nothing for as long is gone: its job's output would pile up in the
    // daemon behind a send that never ends.
    if stream.set_write_timeout(Some(request_timeout)).is_err() {
        return;
    }
    let limits = LineLimits { max_line: MAX_REQUEST_LEN, max_fds: MAX_REQUEST_FDS, timeout: Some(request_timeout) };
    let mut socket = LineSocket::new(stream, limits);
    loop {
        let reply = match socket.receive() {
            Ok(Some((line, files))) => match Request::parse(&line) {
                Ok(request) => daemon.handle(request, files, peer, &mut ClientEvents(&socket)),
                Err(e) => e.reply(),
            },
            Ok(None) | Err(ReceiveError::Io(_)) => return,
            // The stream is out of step with the client: say why, then close.
            Err(e) => {
                let _ = socket.send(&error_reply(ErrorKind::InvalidArgument, e.to_string()), &[]);
                return;
            }
        };
        if socket.send(&reply, &[]).is_err() {
            return;
        }
    }
}
