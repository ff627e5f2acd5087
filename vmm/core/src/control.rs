//! The control socket: a Unix stream socket on which another process (the node daemon, a test)
//! drives a running VM. Requests and replies are `clowder_api::vmm`'s types (docs/api-schema.md),
//! framed by `clowder_api::codec`: one JSON object per line, file descriptors with SCM_RIGHTS
//! on the same line. A malformed request gets an error reply and the connection stays usable;
//! a line over the limits gets an error reply and the connection is closed.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

use clowder_api::codec::{Limits, LineSocket, ReceiveError};
use clowder_api::vmm::{
    AddPieces, AddRegion, ChannelReply, Done, MemoryReply, ProfileReply, RamRange, Region, StatsReply, TranslateReply, VmmRequest, LIMITS,
};
use clowder_api::{ok_reply, parse_reply, ApiError, ErrorKind};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::memory::{RegionAccess, RegionInfo};
use crate::vm::VmHandle;

/// What a client takes from the VMM: replies may be longer than requests (`stats`, `profile`).
const CLIENT_LIMITS: Limits = Limits { max_line: 1 << 20, ..LIMITS };

/// A reply line and the descriptors that ride with it.
type Answer = (Value, Vec<RawFd>);

fn failed(error: impl ToString) -> ApiError {
    ApiError::new(ErrorKind::Failed, error.to_string())
}

fn region(info: &RegionInfo) -> Region {
    Region { slot: info.slot, gpa: info.gpa, len: info.len }
}

/// Answers one request line.
pub fn handle_request(vm: &VmHandle, line: &[u8], files: &[File]) -> Answer {
    VmmRequest::parse(line).and_then(|request| answer(vm, request, files)).unwrap_or_else(|error| (error.reply(), Vec::new()))
}

fn answer(vm: &VmHandle, request: VmmRequest, files: &[File]) -> Result<Answer, ApiError> {
    if !matches!(request, VmmRequest::AddRegion(_) | VmmRequest::AddPieces(_)) && !files.is_empty() {
        return Err(ApiError::invalid("only `add_region` and `add_pieces` take a file descriptor"));
    }
    let done = || (ok_reply(&Done {}), Vec::new());
    Ok(match request {
        VmmRequest::Stats => {
            let reply = StatsReply {
                state: format!("{:?}", vm.state()),
                exits: vm.exit_counters().into_iter().map(|(name, count)| (name.to_string(), count)).collect(),
                regions: vm.regions().iter().map(region).collect(),
            };
            (ok_reply(&reply), Vec::new())
        }
        VmmRequest::Pause => vm.pause().map(|()| done()).map_err(failed)?,
        VmmRequest::Resume => vm.resume().map(|()| done()).map_err(failed)?,
        VmmRequest::Stop => {
            vm.stop();
            done()
        }
        VmmRequest::Memory => {
            let layout = vm.layout();
            let ranges = layout.ram_ranges().map(|r| RamRange { gpa: r.gpa, size: r.size, file_offset: r.file_offset }).collect();
            (ok_reply(&MemoryReply { size: layout.ram_size(), ranges }), vec![vm.memfd()])
        }
        VmmRequest::Channel => {
            let c = vm.channel().ok_or_else(|| ApiError::new(ErrorKind::Unavailable, "this VM has no channel device"))?;
            let reply = ChannelReply {
                gpa: c.gpa,
                size: c.size,
                memfd_offset: c.memfd_offset,
                vector: c.vector,
                doorbell_port: c.doorbell_port,
                fds: ["memfd", "doorbell", "interrupt"].map(String::from).to_vec(),
            };
            (ok_reply(&reply), vec![vm.memfd(), c.doorbell.as_raw_fd(), c.interrupt.as_raw_fd()])
        }
        VmmRequest::AddRegion(AddRegion { offset, len, gpa, read_only }) => {
            let [file] = files else {
                return Err(ApiError::invalid(format!("add_region needs exactly one file descriptor, got {}", files.len())));
            };
            let access = if read_only { RegionAccess::ReadOnly } else { RegionAccess::ReadWrite };
            let added = vm.add_region(file.as_raw_fd(), offset, len, gpa, access).map_err(failed)?;
            (ok_reply(&region(&added)), Vec::new())
        }
        VmmRequest::AddPieces(AddPieces { pieces, gpa, read_only }) => {
            let [file] = files else {
                return Err(ApiError::invalid(format!("add_pieces needs exactly one file descriptor, got {}", files.len())));
            };
            let access = if read_only { RegionAccess::ReadOnly } else { RegionAccess::ReadWrite };
            let pieces: Vec<(u64, u64)> = pieces.into_iter().map(Into::into).collect();
            let added = vm.add_pieces(file.as_raw_fd(), &pieces, gpa, access).map_err(failed)?;
            (ok_reply(&region(&added)), Vec::new())
        }
        VmmRequest::RemoveRegion { slot } => (ok_reply(&region(&vm.remove_region(slot).map_err(failed)?)), Vec::new()),
        VmmRequest::Translate { gpa, len } => {
            let mut fds: Vec<RawFd> = Vec::new();
            let runs = vm
                .translate(gpa, len)
                .map_err(failed)?
                .iter()
                .map(|r| {
                    let fd_index = fds.iter().position(|f| *f == r.fd).unwrap_or_else(|| {
                        fds.push(r.fd);
                        fds.len() - 1
                    });
                    clowder_api::vmm::Run { fd_index, offset: r.offset, len: r.len }
                })
                .collect();
            if fds.len() > LIMITS.max_fds {
                return Err(ApiError::invalid(format!("range spans {} backing files, at most {} per reply", fds.len(), LIMITS.max_fds)));
            }
            (ok_reply(&TranslateReply { runs }), fds)
        }
        VmmRequest::Profile { vcpu, steps } => {
            let p = vm.profile_instructions(vcpu, steps, std::time::Duration::from_secs(60)).map_err(failed)?;
            let reply = ProfileReply {
                steps: p.steps,
                kernel: p.kernel,
                user: p.user,
                kernel_entries: p.kernel_entries,
                kernel_per_entry: p.kernel_per_entry(),
                hot_kernel_addresses: p.hot_kernel_addresses.iter().map(|&(rip, count)| (format!("{rip:#x}"), count)).collect(),
            };
            (ok_reply(&reply), Vec::new())
        }
    })
}

fn serve_connection(vm: &VmHandle, stream: UnixStream) {
    let mut socket = LineSocket::new(stream, LIMITS);
    loop {
        let (reply, fds) = match socket.receive() {
            Ok(Some((line, files))) => handle_request(vm, &line, &files),
            Ok(None) | Err(ReceiveError::Io(_)) => return,
            // The stream is out of step with the client: say why, then close.
            Err(e) => {
                let _ = socket.send(&ApiError::invalid(e.to_string()).reply(), &[]);
                return;
            }
        };
        if socket.send(&reply, &fds).is_err() {
            return;
        }
    }
}

/// Whether the process at the other end may drive this VM (it can read and write guest RAM):
/// only this VMM's own uid and root may.
pub(crate) fn peer_allowed(stream: &UnixStream) -> Result<(), ApiError> {
    let own = rustix::process::geteuid();
    let peer = rustix::net::sockopt::socket_peercred(stream).map_err(|e| failed(format!("cannot read the peer's credentials: {e}")))?;
    if peer.uid == own || peer.uid.is_root() {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorKind::PermissionDenied,
        format!("permission denied: uid {} may not use the control socket of a VMM run by uid {}", peer.uid.as_raw(), own.as_raw()),
    ))
}

/// Listens on `path` and serves every connection on its own thread until the process exits.
/// The socket is 0600 whatever the umask, and each connection's peer is checked as well: the
/// mode only takes effect after bind(), and a later chmod must not open guest RAM to all.
pub fn serve(vm: Arc<VmHandle>, path: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            if let Err(refused) = peer_allowed(&stream) {
                let _ = LineSocket::new(stream, LIMITS).send(&refused.reply(), &[]);
                continue;
            }
            let vm = vm.clone();
            let _ = std::thread::Builder::new().name("control-conn".into()).spawn(move || serve_connection(&vm, stream));
        }
    })?;
    Ok(())
}

/// A client of the control socket.
pub struct ControlClient {
    socket: LineSocket,
}

impl ControlClient {
    pub fn connect(path: &Path) -> io::Result<Self> {
        Ok(ControlClient { socket: LineSocket::new(UnixStream::connect(path)?, CLIENT_LIMITS) })
    }

    /// Sends a request (a [`VmmRequest`], or any JSON: tests send malformed ones) with
    /// descriptors and returns the reply line and the descriptors it carried.
    pub fn call(&mut self, request: &impl Serialize, fds: &[RawFd]) -> io::Result<(Value, Vec<File>)> {
        self.socket.send(request, fds)?;
        match self.socket.receive_json() {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the VMM closed the control socket")),
            Err(ReceiveError::Io(e)) => Err(e),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
    }

    /// Sends a typed request and returns its typed reply and the descriptors it carried; an
    /// error reply becomes its sentence.
    pub fn request<R: DeserializeOwned>(&mut self, request: &VmmRequest, fds: &[RawFd]) -> Result<(R, Vec<File>), String> {
        let (reply, files) = self.call(request, fds).map_err(|e| format!("control socket: {e}"))?;
        parse_reply(reply).map(|reply| (reply, files)).map_err(|e| e.message)
    }
}
