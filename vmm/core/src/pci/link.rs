//! The XEMEM device's way to the node daemon: `MailboxHost` over a Unix socket the VMM listens
//! on (docs/xemem-pci.md). The daemon connects once the guest is up and answers each checked
//! mailbox request on the same connection; the vCPU that rang the doorbell waits for the
//! answer. The framing is the control socket's (`clowder_api::codec`: a JSON object a line).
//!
//! The daemon places attachments itself (through the control socket, as memory slots at the
//! guest-physical address the device reserved), so `place` returns the daemon's token for the
//! attachment, which `unplace` gives back.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clowder_api::codec::{Limits, LineSocket};
use serde::{Deserialize, Serialize};

use super::mailbox::{MailboxHost, MailboxRequest, TouchReporter};
use super::touch::Touch;

/// One call from the VMM to the daemon; `seq` pairs it with its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCall {
    pub seq: u64,
    pub what: Call,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// Every op but ATTACH and DETACH, as the mailbox checked it.
    Request { op: u32, args: [u64; 6], name: Option<String>, runs: Vec<(u64, u64)> },
    /// ATTACH: back `len` bytes at guest-physical `gpa` with permit `apid`'s memory from `offset`.
    Place { apid: u64, offset: u64, len: u64, gpa: u64 },
    /// DETACH of the attachment `place` answered with `token`; answered 1 when the daemon keeps
    /// its memory at the place for the permit's next attach of the same range.
    Unplace { token: u32 },
    /// A guest process touched the attachment `token`, at `window_offset`, after its
    /// revocation (`super::touch`): its attachers get SIGBUS. Answered with no results.
    Touched { token: u32, window_offset: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAnswer {
    pub seq: u64,
    /// Up to four results, or an errno value.
    pub result: Result<[u64; 4], i32>,
}

/// How long a vCPU waits for the daemon: below the guest library's own 10 s, so the guest
/// hears `ETIMEDOUT` from the device rather than giving up on its own.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(8);

/// A RUNS call carries up to 4080 runs: about 200 KiB of JSON.
const LIMITS: Limits = Limits { max_line: 1 << 20, max_fds: 0, timeout: Some(ANSWER_TIMEOUT) };

/// The connection to the daemon, and the last call's sequence number: shared by the mailbox
/// and the touch reporter, whose calls take turns on it.
#[derive(Default)]
struct Link {
    socket: Option<LineSocket>,
    seq: u64,
}

/// `MailboxHost` answered by the daemon connected to this VMM's mailbox socket.
pub struct RemoteHost {
    daemon: Arc<Mutex<Link>>,
}

impl RemoteHost {
    /// Listens on `path` (mode 0600; each connection's peer must be this VMM's uid or root, as
    /// on the control socket). A new connection replaces the previous one.
    pub fn listen(path: &Path) -> io::Result<RemoteHost> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let daemon = Arc::new(Mutex::new(Link::default()));
        let accepted = daemon.clone();
        std::thread::Builder::new().name("xemem-mailbox".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                match crate::control::peer_allowed(&stream) {
                    Ok(()) => accepted.lock().unwrap().socket = Some(LineSocket::new(stream, LIMITS)),
                    Err(refused) => log::warn!("xemem mailbox socket: {}", refused.message),
                }
            }
        })?;
        Ok(RemoteHost { daemon })
    }

    /// A host over an already connected socket (tests).
    pub fn connected(socket: LineSocket) -> RemoteHost {
        RemoteHost { daemon: Arc::new(Mutex::new(Link { socket: Some(socket), seq: 0 })) }
    }

    fn ask(&mut self, what: Call) -> Result<[u64; 4], i32> {
        let mut daemon = self.daemon.lock().unwrap();
        let daemon = &mut *daemon;
        // No daemon yet (or it went away): the guest has a device but nothing behind it.
        let socket = daemon.socket.as_mut().ok_or(libc::ENODEV)?;
        daemon.seq += 1;
        let seq = daemon.seq;
        if socket.send(&HostCall { seq, what }, &[]).is_err() {
            daemon.socket = None;
            return Err(libc::ENODEV);
        }
        loop {
            match socket.receive_json::<HostAnswer>() {
                // An answer to an earlier call that timed out: skipped.
                Ok(Some((answer, _))) if answer.seq < seq => continue,
                Ok(Some((answer, _))) if answer.seq == seq => return answer.result,
                Ok(Some((answer, _))) => {
                    log::warn!("xemem mailbox: the daemon answered call {} while {seq} was the latest; connection dropped", answer.seq);
                }
                Ok(None) => {}
                Err(clowder_api::codec::ReceiveError::TimedOut(_)) => return Err(libc::ETIMEDOUT),
                Err(e) => log::warn!("xemem mailbox: {e}; connection dropped"),
            }
            daemon.socket = None;
            return Err(libc::ENODEV);
        }
    }
}

impl MailboxHost for RemoteHost {
    fn call(&mut self, request: &MailboxRequest) -> Result<[u64; 4], i32> {
        let what = Call::Request { op: request.op as u32, args: request.args, name: request.name.clone(), runs: request.runs.clone() };
        self.ask(what)
    }

    fn place(&mut self, apid: u64, offset: u64, len: u64, gpa: u64) -> Result<u32, i32> {
        let [token, ..] = self.ask(Call::Place { apid, offset, len, gpa })?;
        u32::try_from(token).map_err(|_| libc::EIO)
    }

    /// The daemon answers 1 when it keeps the attachment's memory at its place.
    fn unplace(&mut self, token: u32) -> bool {
        match self.ask(Call::Unplace { token }) {
            Ok([kept, ..]) => kept == 1,
            Err(errno) => {
                log::warn!("xemem mailbox: the daemon did not detach attachment {token}: errno {errno}");
                false
            }
        }
    }

    /// The same daemon connection, taking turns with the mailbox's calls.
    fn reporter(&self) -> Option<Box<dyn TouchReporter>> {
        Some(Box::new(RemoteHost { daemon: self.daemon.clone() }))
    }
}

impl TouchReporter for RemoteHost {
    fn touched(&mut self, touch: Touch) {
        if let Err(errno) = self.ask(Call::Touched { token: touch.token, window_offset: touch.window_offset }) {
            log::warn!("xemem mailbox: the daemon did not take a touch of revoked attachment {}: errno {errno}", touch.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::mailbox::Op;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn hello() -> MailboxRequest {
        MailboxRequest { op: Op::Hello, args: [0; 6], name: None, runs: Vec::new() }
    }

    #[test]
    fn calls_are_answered_in_step_and_a_bad_daemon_is_dropped() {
        let (vmm, daemon) = UnixStream::pair().unwrap();
        let mut host = RemoteHost::connected(LineSocket::new(vmm, LIMITS));
        let server = std::thread::spawn(move || {
            let mut socket = LineSocket::new(daemon, LIMITS);
            // First call: a stale answer first (skipped), then its own.
            let (call, _) = socket.receive_json::<HostCall>().unwrap().unwrap();
            assert!(matches!(call.what, Call::Request { op: 1, .. }));
            socket.send(&HostAnswer { seq: call.seq - 1, result: Err(libc::EIO) }, &[]).unwrap();
            socket.send(&HostAnswer { seq: call.seq, result: Ok([1, 2, 3, 4]) }, &[]).unwrap();
            // Second: a placement, answered with token 7.
            let (call, _) = socket.receive_json::<HostCall>().unwrap().unwrap();
            assert_eq!(call.what, Call::Place { apid: 5, offset: 0, len: 4096, gpa: WINDOW });
            socket.send(&HostAnswer { seq: call.seq, result: Ok([7, 0, 0, 0]) }, &[]).unwrap();
            // The reporter's touch, in step on the same connection.
            let (touch, _) = socket.receive_json::<HostCall>().unwrap().unwrap();
            assert_eq!(touch.what, Call::Touched { token: 7, window_offset: 0 });
            assert_eq!(touch.seq, call.seq + 1, "one sequence for both");
            socket.send(&HostAnswer { seq: touch.seq, result: Ok([0; 4]) }, &[]).unwrap();
            // Then garbage.
            let _ = socket.receive_json::<HostCall>().unwrap().unwrap();
            socket.stream().write_all(b"{\"not\": \"an answer\"}\n").unwrap();
        });
        const WINDOW: u64 = 1 << 45;
        assert_eq!(host.call(&hello()), Ok([1, 2, 3, 4]));
        assert_eq!(host.place(5, 0, 4096, WINDOW), Ok(7));
        host.reporter().expect("a reporter").touched(Touch { token: 7, window_offset: 0 });
        assert_eq!(host.call(&hello()), Err(libc::ENODEV), "a malformed answer drops the daemon");
        assert_eq!(host.call(&hello()), Err(libc::ENODEV), "and nothing is behind the device any more");
        server.join().unwrap();
    }
}
