//! SOCK_SEQPACKET Unix sockets (one request or answer per packet, so no framing) with
//! descriptors passed as SCM_RIGHTS and the peer's credentials from SO_PEERCRED: the XEMEM
//! broker's socket and the daemons' XEMEM links.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketAddrUnix, SocketFlags, SocketType,
};

/// At most this many descriptors travel with one packet (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;

fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

fn address(path: &Path) -> io::Result<SocketAddrUnix> {
    SocketAddrUnix::new(path).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"))
}

/// Binds and listens on `path` (replacing a stale socket file), readable and writable by all:
/// access to segments is checked per request against the caller's credentials, not by who may
/// connect.
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let _ = std::fs::remove_file(path);
    rustix::net::bind(&fd, &address(path)?)?;
    rustix::fs::chmod(path, rustix::fs::Mode::from_bits_truncate(0o666))?;
    rustix::net::listen(&fd, 128)?;
    Ok(fd)
}

pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    rustix::net::connect(&fd, &address(path)?)?;
    Ok(fd)
}

/// The next connection; a signal or a connection aborted before it was taken is skipped.
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    loop {
        match rustix::net::accept_with(listener, SocketFlags::CLOEXEC) {
            Ok(fd) => return Ok(fd),
            Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

/// Who is at the other end, as of its connect(): pid, effective uid and gid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer(fd: &OwnedFd) -> io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(fd)?;
    Ok(Peer { pid: cred.pid.as_raw_nonzero().get() as u32, uid: cred.uid.as_raw(), gid: cred.gid.as_raw() })
}

pub fn set_receive_timeout(fd: &OwnedFd, timeout: Duration) -> io::Result<()> {
    Ok(rustix::net::sockopt::set_socket_timeout(fd, rustix::net::sockopt::Timeout::Recv, Some(timeout))?)
}

/// Sends one packet with `fds` attached.
pub fn send(fd: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one packet"));
    }
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "descriptors do not fit the control buffer"));
    }
    loop {
        match rustix::net::sendmsg(fd, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

/// Receives one packet into `buffer`; returns its length (0: the peer closed) and the
/// descriptors that came with it. A packet longer than the buffer is an error (truncated).
pub fn receive(fd: &OwnedFd, buffer: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        // MSG_CMSG_CLOEXEC keeps received descriptors out of anything the process might exec.
        match rustix::net::recvmsg(fd, &mut [IoSliceMut::new(buffer)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(received) => break received,
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => return Err(error.into()),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "packet or descriptors truncated"));
    }
    Ok((received.bytes, fds))
}
