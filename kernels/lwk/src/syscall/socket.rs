//! socket, socketpair, bind, listen, accept, accept4, connect, shutdown, getsockname,
//! getpeername, getsockopt, setsockopt: sockets the host holds for a persistent enclave's job
//! (`crate::net`), in the job user's name. Only a persistent enclave has them (elsewhere
//! EAFNOSUPPORT); families AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (the host takes only
//! NETLINK_ROUTE: `getifaddrs` lists the node's interfaces as the user sees them, which Open
//! MPI, PMIx and UCX's TCP transport look for), the host checking the rest (types, protocols,
//! addresses, permissions) as for the user. Blocking calls sleep only the calling
//! thread and end with EINTR on a signal (restarted under SA_RESTART). The data calls are in
//! `socket_io`.

use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::job::{self, descriptors::Descriptor};
use crate::net::{self, Socket, POLLIN, POLLOUT};
use alloc::sync::Arc;
use alloc::vec::Vec;
use enclave_proto::SocketOp;

const AF_UNIX: i32 = 1;
const AF_INET: i32 = 2;
const AF_INET6: i32 = 10;
const AF_NETLINK: i32 = 16;
pub const SOCK_NONBLOCK: i32 = 0o4000;
pub const SOCK_CLOEXEC: i32 = 0o2000000;
const SOL_SOCKET: i32 = 1;
const SO_ERROR: i32 = 4;
/// Linux's `struct sockaddr_storage`: no address is longer.
pub const ADDRESS_MAX: u32 = 128;
/// The longest option value passed on (Linux's are at most a few dozen bytes).
const OPTION_MAX: u32 = 256;
const EINPROGRESS: i64 = -(Errno::EINPROGRESS.0 as i64);

/// The socket `fd` names (`ENOTSOCK` for another open file, `EBADF` for none).
pub fn socket_of(fd: Fd) -> Result<Arc<Socket>, Errno> {
    job::with_process(|process| match process.descriptors.get(fd).as_deref() {
        Some(Descriptor::Socket(socket)) => Ok(socket.clone()),
        Some(_) => Err(Errno::ENOTSOCK),
        None => Err(Errno::EBADF),
    })
}

/// Reads a `sockaddr` of `len` bytes from the job.
pub fn read_address(address: UserAddr, len: u32) -> Result<Vec<u8>, Errno> {
    if len > ADDRESS_MAX {
        return Err(Errno::EINVAL);
    }
    if len == 0 {
        return Ok(Vec::new());
    }
    user::read_bytes(address, len as usize)
}

/// Writes `value` (an address or an option) to a buffer the job sized in `*len_at`, truncated
/// to it, and the full length to `*len_at`, as Linux does; nothing when `buffer` is NULL.
pub fn write_sized(buffer: UserAddr, len_at: UserAddr, value: &[u8]) -> Result<(), Errno> {
    if buffer.is_null() {
        return Ok(());
    }
    let mut len = [0u8; 4];
    user::read_into(len_at, &mut len)?;
    let room = i32::from_le_bytes(len);
    if room < 0 {
        return Err(Errno::EINVAL);
    }
    user::write_bytes(buffer, &value[..value.len().min(room as usize)])?;
    user::write_bytes(len_at, &(value.len() as u32).to_le_bytes())
}

/// Installs a new socket as a descriptor; the host's socket closes again if the table is full.
fn install(socket: Arc<Socket>, close_on_exec: bool) -> SyscallResult {
    job::with_process(|process| process.descriptors.insert_flagged(Descriptor::Socket(socket), close_on_exec))
        .map(u64::from)
        .ok_or(Errno::EMFILE)
}

fn check_family(domain: i32, kind: i32) -> Result<(), Errno> {
    if !crate::enclave::is_active() || !matches!(domain, AF_UNIX | AF_INET | AF_INET6 | AF_NETLINK) {
        return Err(Errno::EAFNOSUPPORT);
    }
    if kind & !(SOCK_NONBLOCK | SOCK_CLOEXEC | 0xf) != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn events_at(data: &[u8], at: usize) -> u32 {
    data.get(at..at + 4).map_or(0, |bytes| u32::from_le_bytes(bytes.try_into().unwrap_or_default()))
}

pub fn socket(domain: i32, kind: i32, protocol: i32) -> SyscallResult {
    check_family(domain, kind)?;
    let base = (kind & 0xf) as u32;
    let answer = net::request(SocketOp::Socket { domain: domain as u32, kind: base, protocol: protocol as u32 });
    let handle = net::result_of(answer.result)? as u32;
    install(Socket::new(handle, base, kind & SOCK_NONBLOCK != 0, answer.events), kind & SOCK_CLOEXEC != 0)
}

/// socketpair(domain, type, protocol, sv): a connected pair the host makes (AF_UNIX).
pub fn socketpair(domain: i32, kind: i32, protocol: i32, pair: UserAddr) -> SyscallResult {
    check_family(domain, kind)?;
    let base = (kind & 0xf) as u32;
    let answer = net::request(SocketOp::Pair { domain: domain as u32, kind: base, protocol: protocol as u32 });
    let first = net::result_of(answer.result)? as u32;
    let non_blocking = kind & SOCK_NONBLOCK != 0;
    let first = Socket::new(first, base, non_blocking, answer.events);
    let second = Socket::new(events_at(&answer.data, 0), base, non_blocking, events_at(&answer.data, 4));
    let close_on_exec = kind & SOCK_CLOEXEC != 0;
    let first = install(first, close_on_exec)?;
    let second = match install(second, close_on_exec) {
        Ok(second) => second,
        Err(errno) => {
            let open = job::with_process(|process| process.descriptors.remove(Fd(first as i32)));
            drop(open);
            return Err(errno);
        }
    };
    user::write_bytes(pair, &[(first as i32).to_le_bytes(), (second as i32).to_le_bytes()].concat())?;
    Ok(0)
}

pub fn bind(fd: Fd, address: UserAddr, len: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    let address = read_address(address, len)?;
    net::result_of(net::request(SocketOp::Bind { handle: socket.handle, address: &address }).result)
}

/// connect: the host connects without waiting (EINPROGRESS); a blocking socket then waits
/// until it is writable and takes the outcome from SO_ERROR, as Linux's connect does inside.
pub fn connect(fd: Fd, address: UserAddr, len: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    let address = read_address(address, len)?;
    let answer = socket.call_blocking(POLLOUT, false, &|| SocketOp::Connect { handle: socket.handle, address: &address })?;
    if answer.result != EINPROGRESS || socket.non_blocking() {
        return net::result_of(answer.result);
    }
    socket.wait_for(POLLOUT)?;
    let error = net::request(SocketOp::GetOption { handle: socket.handle, level: SOL_SOCKET, name: SO_ERROR, len: 4 });
    net::result_of(error.result)?;
    match events_at(&error.data, 0) {
        0 => Ok(0),
        errno => Err(Errno(errno as u64)),
    }
}

pub fn listen(fd: Fd, backlog: i32) -> SyscallResult {
    let socket = socket_of(fd)?;
    net::result_of(net::request(SocketOp::Listen { handle: socket.handle, backlog }).result)
}

pub fn accept(fd: Fd, address: UserAddr, len: UserAddr) -> SyscallResult {
    accept4(fd, address, len, 0)
}

/// accept4: the answer's data is the new socket's readiness, then the peer's address.
pub fn accept4(fd: Fd, address: UserAddr, len: UserAddr, flags: i32) -> SyscallResult {
    if flags & !(SOCK_NONBLOCK | SOCK_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    let socket = socket_of(fd)?;
    let answer = socket.call_blocking(POLLIN, false, &|| SocketOp::Accept { handle: socket.handle })?;
    let handle = net::result_of(answer.result)? as u32;
    let accepted = Socket::new(handle, socket.kind, flags & SOCK_NONBLOCK != 0, events_at(&answer.data, 0));
    let peer = answer.data.get(4..).unwrap_or_default();
    let fd = install(accepted, flags & SOCK_CLOEXEC != 0)?;
    if let Err(errno) = write_sized(address, len, peer) {
        let open = job::with_process(|process| process.descriptors.remove(Fd(fd as i32)));
        drop(open);
        return Err(errno);
    }
    Ok(fd)
}

pub fn shutdown(fd: Fd, how: i32) -> SyscallResult {
    let socket = socket_of(fd)?;
    net::result_of(net::request(SocketOp::Shutdown { handle: socket.handle, how: how as u32 }).result)
}

fn name(fd: Fd, address: UserAddr, len: UserAddr, peer: bool) -> SyscallResult {
    let socket = socket_of(fd)?;
    let answer = net::request(SocketOp::Name { handle: socket.handle, peer });
    net::result_of(answer.result)?;
    write_sized(address, len, &answer.data)?;
    Ok(0)
}

pub fn getsockname(fd: Fd, address: UserAddr, len: UserAddr) -> SyscallResult {
    name(fd, address, len, false)
}

pub fn getpeername(fd: Fd, address: UserAddr, len: UserAddr) -> SyscallResult {
    name(fd, address, len, true)
}

pub fn getsockopt(fd: Fd, level: i32, option: i32, value: UserAddr, len: UserAddr) -> SyscallResult {
    let socket = socket_of(fd)?;
    let mut room = [0u8; 4];
    user::read_into(len, &mut room)?;
    let room = i32::from_le_bytes(room);
    if room < 0 {
        return Err(Errno::EINVAL);
    }
    let answer = net::request(SocketOp::GetOption { handle: socket.handle, level, name: option, len: (room as u32).min(OPTION_MAX) });
    net::result_of(answer.result)?;
    write_sized(value, len, &answer.data)?;
    Ok(0)
}

/// setsockopt: passed to the host's socket. The host's sockets never block, so SO_RCVTIMEO
/// and SO_SNDTIMEO are kept there but do not bound a wait here.
pub fn setsockopt(fd: Fd, level: i32, option: i32, value: UserAddr, len: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    if len > OPTION_MAX {
        return Err(Errno::EINVAL);
    }
    let value = if len == 0 { Vec::new() } else { user::read_bytes(value, len as usize)? };
    net::result_of(net::request(SocketOp::SetOption { handle: socket.handle, level, name: option, value: &value }).result)
}
