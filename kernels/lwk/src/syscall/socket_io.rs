//! sendto, recvfrom, sendmsg, recvmsg, and read, write, readv and writev on sockets: one host
//! request per call moves every piece of the job's buffers (`crate::net::runs_of`). Flags go to
//! the host as given (MSG_PEEK, MSG_TRUNC, MSG_OOB, ...), except MSG_DONTWAIT, which only means
//! "do not wait" here; the host never raises SIGPIPE: EPIPE raises it here, unless
//! MSG_NOSIGNAL. A blocking send on a stream socket sends everything, waiting for room as
//! Linux does. Ancillary data: SCM_RIGHTS of the job's sockets (the host passes its sockets;
//! the receiver's new descriptors name them); any other descriptor or control message is
//! refused with EOPNOTSUPP.

use super::read::{read_iovec, IOV_MAX};
use super::socket::{read_address, socket_of, write_sized, ADDRESS_MAX};
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::job::{self, descriptors::Descriptor};
use crate::net::{self, Socket, POLLIN, POLLOUT};
use crate::{sched, signal};
use alloc::sync::Arc;
use alloc::vec::Vec;
use enclave_proto::SocketOp;

const MSG_DONTWAIT: u32 = 0x40;
const MSG_NOSIGNAL: u32 = 0x4000;
const SOCK_STREAM: u32 = 1;
const SIGPIPE: u8 = 13;

/// The `count` pieces of an iovec array.
pub fn iovecs(vector: UserAddr, count: u64) -> Result<Vec<(UserAddr, u64)>, Errno> {
    if count > IOV_MAX as u64 {
        return Err(Errno::EMSGSIZE);
    }
    (0..count).map(|index| read_iovec(vector, index)).collect()
}

/// Sends the bytes of `pieces` (to `address` when not empty, with the host handles `rights`,
/// u32s, passed along the first part); the count sent.
pub fn send(socket: &Socket, pieces: &[(UserAddr, u64)], flags: u32, address: &[u8], rights: &[u8]) -> SyscallResult {
    let total: u64 = pieces.iter().map(|(_, len)| len).sum();
    let dont_wait = flags & MSG_DONTWAIT != 0;
    let host_flags = flags & !MSG_DONTWAIT;
    let mut sent = 0u64;
    loop {
        let rest = remaining(pieces, sent);
        let runs = net::runs_of(&rest, false)?;
        let result = socket.call_blocking(POLLOUT, dont_wait, &|| SocketOp::Send {
            handle: socket.handle,
            flags: host_flags,
            address,
            rights: if sent == 0 { rights } else { &[] },
            runs: runs.list(),
        });
        let count = match result.and_then(|answer| net::result_of(answer.result)) {
            Ok(count) => count,
            Err(_) if sent > 0 => return Ok(sent),
            Err(errno) => {
                if errno == Errno::EPIPE && flags & MSG_NOSIGNAL == 0 {
                    let _ = signal::send(Some(sched::current_tid()), SIGPIPE, signal::SI_USER);
                }
                return Err(errno);
            }
        };
        sent += count;
        // A blocking stream send goes on until everything is sent; anything else returns.
        if sent >= total || count == 0 || socket.kind != SOCK_STREAM || dont_wait || socket.non_blocking() {
            return Ok(sent);
        }
    }
}

/// `pieces` without their first `skip` bytes.
fn remaining(pieces: &[(UserAddr, u64)], mut skip: u64) -> Vec<(UserAddr, u64)> {
    let mut rest = Vec::new();
    for &(base, len) in pieces {
        if skip >= len {
            skip -= len;
            continue;
        }
        rest.push((base + skip, len - skip));
        skip = 0;
    }
    rest
}

/// What a receive got: the count, the host's msg_flags, the sender's address and the sockets
/// passed with it (closed again unless installed).
pub struct Received {
    pub count: u64,
    pub flags: u32,
    pub address: Vec<u8>,
    pub sockets: Vec<Arc<Socket>>,
}

pub fn receive_from(socket: &Socket, pieces: &[(UserAddr, u64)], flags: u32) -> Result<Received, Errno> {
    let runs = net::runs_of(pieces, true)?;
    let answer = socket.call_blocking(POLLIN, flags & MSG_DONTWAIT != 0, &|| SocketOp::Recv {
        handle: socket.handle,
        flags: flags & !MSG_DONTWAIT,
        runs: runs.list(),
    })?;
    let count = net::result_of(answer.result)?;
    runs.copy_back(count)?;
    let word = |at: usize| answer.data.get(at..at + 4).map_or(0, |bytes| u32::from_le_bytes(bytes.try_into().unwrap_or_default()));
    let address_len = (word(4) as usize).min(answer.data.len().saturating_sub(8));
    let address = answer.data[8.min(answer.data.len())..8 + address_len].to_vec();
    let sockets = (8 + address_len..answer.data.len().saturating_sub(11))
        .step_by(12)
        .map(|at| Socket::new(word(at), word(at + 8), false, word(at + 4)))
        .collect();
    Ok(Received { count, flags: word(0), address, sockets })
}

/// `read` and `readv` of a socket.
pub fn receive(socket: &Socket, pieces: &[(UserAddr, u64)], flags: u32) -> SyscallResult {
    receive_from(socket, pieces, flags).map(|received| received.count)
}

pub fn sendto(fd: Fd, buffer: UserAddr, len: usize, flags: u32, address: UserAddr, address_len: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    let address = if address.is_null() { Vec::new() } else { read_address(address, address_len)? };
    send(&socket, &[(buffer, len as u64)], flags, &address, &[])
}

pub fn recvfrom(fd: Fd, buffer: UserAddr, len: usize, flags: u32, address: UserAddr, address_len: UserAddr) -> SyscallResult {
    let socket = socket_of(fd)?;
    let received = receive_from(&socket, &[(buffer, len as u64)], flags)?;
    write_sized(address, address_len, &received.address)?;
    Ok(received.count)
}

/// Linux's `struct msghdr` on x86-64 (its binding is a struct of pointers): the offsets of
/// name, namelen, iov, iovlen, controllen and flags, and its size.
mod msghdr {
    pub const NAME: usize = 0;
    pub const NAME_LEN: usize = 8;
    pub const IOV: usize = 16;
    pub const IOV_LEN: usize = 24;
    pub const CONTROL: usize = 32;
    pub const CONTROL_LEN: usize = 40;
    pub const FLAGS: usize = 48;
    pub const SIZE: usize = 56;
}

fn word(header: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or_default())
}

fn half(header: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(header[at..at + 4].try_into().unwrap_or_default())
}

pub fn sendmsg(fd: Fd, message: UserAddr, flags: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    let mut header = [0u8; msghdr::SIZE];
    user::read_into(message, &mut header)?;
    let rights = rights_of(UserAddr(word(&header, msghdr::CONTROL)), word(&header, msghdr::CONTROL_LEN))?;
    let (name, name_len) = (word(&header, msghdr::NAME), half(&header, msghdr::NAME_LEN));
    let address = if name == 0 { Vec::new() } else { read_address(UserAddr(name), name_len)? };
    let pieces = iovecs(UserAddr(word(&header, msghdr::IOV)), word(&header, msghdr::IOV_LEN))?;
    send(&socket, &pieces, flags, &address, &rights)
}

/// `struct cmsghdr`: u64 length, i32 level, i32 type, then the data, each message aligned to 8.
const CMSG_HEADER: usize = 16;
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
/// The most control bytes taken (room for Linux's SCM_MAX_FD descriptors).
const CONTROL_MAX: u64 = 4096;
const MSG_CTRUNC: u32 = 0x8;
const MSG_CMSG_CLOEXEC: u32 = 0x4000_0000;

/// The host handles of the sockets a `sendmsg`'s SCM_RIGHTS passes (u32s); other control
/// messages, and descriptors that are not sockets, EOPNOTSUPP.
fn rights_of(control: UserAddr, len: u64) -> Result<Vec<u8>, Errno> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if len > CONTROL_MAX {
        return Err(Errno::ENOBUFS);
    }
    let bytes = user::read_bytes(control, len as usize)?;
    let mut rights = Vec::new();
    let mut at = 0;
    while at + CMSG_HEADER <= bytes.len() {
        let message_len = word(&bytes, at) as usize;
        if message_len < CMSG_HEADER || at + message_len > bytes.len() {
            return Err(Errno::EINVAL);
        }
        let (level, kind) = (half(&bytes, at + 8) as i32, half(&bytes, at + 12) as i32);
        if (level, kind) != (SOL_SOCKET, SCM_RIGHTS) {
            return Err(Errno::EOPNOTSUPP);
        }
        for fd in bytes[at + CMSG_HEADER..at + message_len].chunks_exact(4) {
            let passed = match socket_of(Fd(i32::from_le_bytes([fd[0], fd[1], fd[2], fd[3]]))) {
                Err(Errno::ENOTSOCK) => return Err(Errno::EOPNOTSUPP),
                other => other?,
            };
            rights.extend_from_slice(&passed.handle.to_le_bytes());
        }
        at += message_len.next_multiple_of(8);
    }
    Ok(rights)
}

/// Installs the sockets a message brought and writes their SCM_RIGHTS message into the
/// caller's control buffer (as many as fit; the rest close, and MSG_CTRUNC says so); the
/// control length used.
fn deliver_rights(sockets: Vec<Arc<Socket>>, control: UserAddr, room: u64, close_on_exec: bool, flags: &mut u32) -> Result<u64, Errno> {
    let fit = (room.saturating_sub(CMSG_HEADER as u64) / 4) as usize;
    if sockets.len() > fit {
        *flags |= MSG_CTRUNC;
    }
    let sockets: Vec<Arc<Socket>> = sockets.into_iter().take(fit).collect();
    if sockets.is_empty() {
        return Ok(0);
    }
    let mut fds = Vec::new();
    for socket in sockets {
        let installed = job::with_process(|process| process.descriptors.insert_flagged(Descriptor::Socket(socket), close_on_exec));
        match installed {
            Some(fd) => fds.push(fd.0),
            None => *flags |= MSG_CTRUNC,
        }
    }
    let len = CMSG_HEADER + 4 * fds.len();
    let mut message = Vec::with_capacity(len);
    message.extend_from_slice(&(len as u64).to_le_bytes());
    message.extend_from_slice(&SOL_SOCKET.to_le_bytes());
    message.extend_from_slice(&SCM_RIGHTS.to_le_bytes());
    for fd in &fds {
        message.extend_from_slice(&fd.to_le_bytes());
    }
    user::write_bytes(control, &message)?;
    Ok((len.next_multiple_of(8) as u64).min(room))
}

pub fn recvmsg(fd: Fd, message: UserAddr, flags: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    let mut header = [0u8; msghdr::SIZE];
    user::read_into(message, &mut header)?;
    let pieces = iovecs(UserAddr(word(&header, msghdr::IOV)), word(&header, msghdr::IOV_LEN))?;
    let received = receive_from(&socket, &pieces, flags)?;
    let (name, name_len) = (word(&header, msghdr::NAME), half(&header, msghdr::NAME_LEN));
    if name != 0 {
        let address = &received.address[..received.address.len().min(ADDRESS_MAX as usize)];
        user::write_bytes(UserAddr(name), &address[..address.len().min(name_len as usize)])?;
        user::write_bytes(message + msghdr::NAME_LEN as u64, &(address.len() as u32).to_le_bytes())?;
    }
    let mut message_flags = received.flags;
    let (control, room) = (UserAddr(word(&header, msghdr::CONTROL)), word(&header, msghdr::CONTROL_LEN));
    let used = deliver_rights(received.sockets, control, room, flags & MSG_CMSG_CLOEXEC != 0, &mut message_flags)?;
    user::write_bytes(message + msghdr::CONTROL_LEN as u64, &used.to_le_bytes())?;
    user::write_bytes(message + msghdr::FLAGS as u64, &message_flags.to_le_bytes())?;
    Ok(received.count)
}
