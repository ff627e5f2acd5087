//! The host's XEMEM segment broker inside the daemon: `libxpmem` in every host process connects
//! to it (see `docs/xemem.md`), and `xemem_ls` lists its segments.
//!
//! The broker itself is `xemem_host::Broker`; this module only gives it a socket, a thread per
//! connection, and turns its listing into the API's JSON.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use xemem::nameserver::Listing;
use xemem_host::Broker;

use crate::admission::{Admissions, Backoff, ConnectionLimits};

/// The daemon's running broker and where applications reach it.
pub struct XememService {
    pub broker: Broker,
    pub socket: PathBuf,
}

/// Where the broker listens when the daemon's API socket is `api_socket`:
/// `$CLOWDER_XEMEM_SOCKET`, else `xemem.sock` beside the API socket. Whenever the API socket
/// itself came from `$CLOWDER_SOCKET` or the default, this is exactly
/// `xemem_host::default_socket_path()`, which is where libxpmem looks. With `--socket` the
/// broker still follows the daemon, so a daemon on a private socket never collides with the
/// system's broker; applications then set `CLOWDER_SOCKET` as every other client does.
pub fn socket_beside(api_socket: &Path) -> PathBuf {
    if let Some(path) = std::env::var_os("CLOWDER_XEMEM_SOCKET").filter(|p| !p.is_empty()) {
        return path.into();
    }
    match api_socket.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        Some(dir) => dir.join("xemem.sock"),
        None => xemem_host::default_socket_path(),
    }
}

/// Binds the broker's socket (SOCK_SEQPACKET, mode 0666: any local user may use the XPMEM API;
/// each request is checked against the caller's credentials) and serves it on a thread.
/// Binding happens before this returns, so the socket exists once the daemon says it listens.
pub fn start(socket: &Path) -> Result<XememService, String> {
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    // Two brokers would split the host's name space: applications would see one or the other
    // depending on when they connected.
    if crate::sys::connect(socket).is_ok() {
        return Err(format!(
            "an XEMEM broker (another clowderd or xemem-broker) is already listening on {}; stop it, \
             or give this daemon another socket with --xemem-socket PATH",
            socket.display()
        ));
    }
    let listener = crate::sys::listen(socket).map_err(|e| format!("binding the XEMEM socket {}: {e}", socket.display()))?;
    // Every owner's converted memfds are held until the owner goes: allow as many descriptors
    // as the system does.
    crate::sys::raise_descriptor_limit();
    let broker = Broker::new();
    let serving = broker.clone();
    std::thread::Builder::new()
        .name("xemem-accept".into())
        .spawn(move || accept_forever(&serving, &listener))
        .map_err(|e| format!("starting the XEMEM thread: {e}"))?;
    Ok(XememService { broker, socket: socket.to_path_buf() })
}

/// How many broker connections users may hold. Every process that uses libxpmem keeps one for
/// its life (MPI ranks: one each), so the bound is far above the API socket's, yet a flood by
/// one user can no longer take every descriptor the daemon has.
const BROKER_LIMITS: ConnectionLimits = ConnectionLimits { per_user: 1024, total: 8192 };

fn accept_forever(broker: &Broker, listener: &OwnedFd) {
    let admissions = Admissions::new("the XEMEM broker", BROKER_LIMITS);
    let mut backoff = Backoff::new("the XEMEM broker");
    loop {
        let connection = match crate::sys::accept(listener) {
            Ok(connection) => connection,
            // Out of descriptors or memory for a moment: the API and the connections already
            // served must keep working, so wait and accept again rather than give up.
            Err(e) => {
                backoff.failed("accepting a connection", &e);
                continue;
            }
        };
        let admitted = crate::sys::peer(&connection).map_err(|e| format!("cannot read the peer's credentials: {e}"));
        let admission = match admitted.and_then(|peer| admissions.admit(peer.uid)) {
            Ok(admission) => admission,
            // libxpmem sees its connection close and fails the call that needed the broker.
            Err(why) => {
                log::warn!("xemem: refused a connection: {why}");
                continue;
            }
        };
        let broker = broker.clone();
        let spawned = std::thread::Builder::new().name("xemem".into()).spawn(move || {
            let _admission = admission;
            broker.serve_connection(connection)
        });
        match spawned {
            Err(e) => backoff.failed("starting a connection thread", &e),
            Ok(_) => backoff.succeeded(),
        }
    }
}

impl XememService {
    /// The `xemem_ls` reply: every segment the host's name server knows, then the enclaves'
    /// (`enclave_segments`, from the daemon's XEMEM node).
    pub fn list_reply(&self, enclave_segments: &[Listing]) -> Value {
        let segments: Vec<Value> = self
            .broker
            .list()
            .iter()
            .chain(enclave_segments)
            .map(|listing| {
                json!({
                    "segid": listing.segment.raw(),
                    "segid_hex": format!("{:#x}", listing.segment.raw()),
                    "owner_enclave": listing.owner,
                    "owner_process": listing.process,
                    "size": listing.size,
                    "name": listing.name.as_ref().map(|name| String::from_utf8_lossy(name.as_bytes()).into_owned()),
                })
            })
            .collect();
        json!({"ok": true, "socket": self.socket.display().to_string(), "segments": segments})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_socket_follows_the_api_socket() {
        // Only meaningful without an override in the environment running the tests.
        if std::env::var_os("CLOWDER_XEMEM_SOCKET").is_some() {
            return;
        }
        assert_eq!(socket_beside(Path::new("/tmp/x/c.sock")), PathBuf::from("/tmp/x/xemem.sock"));
        assert_eq!(socket_beside(Path::new("/run/clowder/clowderd.sock")), PathBuf::from("/run/clowder/xemem.sock"));
    }

    #[test]
    fn an_empty_broker_lists_nothing() {
        let dir = std::env::temp_dir().join(format!("clowderd-xemem-unit-{}", std::process::id()));
        let socket = dir.join("xemem.sock");
        let service = start(&socket).unwrap();
        let reply = service.list_reply(&[]);
        assert_eq!(reply["ok"], json!(true));
        assert_eq!(reply["segments"], json!([]));
        // A second broker on the same socket is refused rather than splitting the name space.
        let Err(second) = start(&socket) else { panic!("a second broker started on {}", socket.display()) };
        assert!(second.contains("already listening"), "{second}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
