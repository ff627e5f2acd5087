//! The daemon's socket: bind it, accept clients, one thread per connection.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

use crate::api::{error_reply, parse_request};
use crate::daemon::{Daemon, EventSink};
use crate::jsonl::LineSocket;
use crate::peer::peer_of;

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

/// Serves clients until the listener fails.
pub fn serve(daemon: Arc<Daemon>, listener: UnixListener) -> io::Result<()> {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let daemon = daemon.clone();
        std::thread::Builder::new().name("client".into()).spawn(move || serve_client(&daemon, stream))?;
    }
    Ok(())
}

/// Job events go to the client's connection.
struct ClientEvents<'a>(&'a LineSocket);

impl EventSink for ClientEvents<'_> {
    fn send(&mut self, event: &serde_json::Value) -> io::Result<()> {
        self.0.send(event, &[])
    }

    fn client_gone(&self) -> bool {
        self.0.peer_hung_up()
    }
}

fn serve_client(daemon: &Arc<Daemon>, stream: UnixStream) {
    let peer = match peer_of(&stream) {
        Ok(peer) => peer,
        Err(e) => {
            let _ = LineSocket::new(stream).send(&error_reply(format!("cannot read your credentials: {e}")), &[]);
            return;
        }
    };
    let mut socket = LineSocket::new(stream);
    loop {
        let reply = match socket.receive() {
            Ok(Some((line, files))) => match parse_request(&line) {
                Ok(request) => daemon.handle(request, files, &peer, &mut ClientEvents(&socket)),
                Err(e) => error_reply(e),
            },
            Ok(None) => return,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => error_reply(format!("malformed request: {e}")),
            Err(_) => return,
        };
        if socket.send(&reply, &[]).is_err() {
            return;
        }
    }
}
