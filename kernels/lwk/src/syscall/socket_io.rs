//! sendto, recvfrom, sendmsg, recvmsg, and read, write, readv and writev on sockets: one host
//! request per call moves every piece of the job's buffers (`crate::net::runs_of`). Flags go to
//! the host as given (MSG_PEEK, MSG_TRUNC, MSG_OOB, ...), except MSG_DONTWAIT, which only means
//! "do not wait" here; the host never raises SIGPIPE: EPIPE raises it here, unless
//! MSG_NOSIGNAL. A blocking send on a stream socket sends everything, waiting for room as
//! Linux does. Ancillary data (SCM_RIGHTS, SCM_CREDENTIALS) is refused with EOPNOTSUPP; a
//! received message has none (msg_controllen 0).

use super::read::{read_iovec, IOV_MAX};
use super::socket::{read_address, socket_of, write_sized, ADDRESS_MAX};
use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::net::{self, Socket, POLLIN, POLLOUT};
use crate::{sched, signal};
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

/// Sends the bytes of `pieces` (to `address` when not empty); the count sent.
pub fn send(socket: &Socket, pieces: &[(UserAddr, u64)], flags: u32, address: &[u8]) -> SyscallResult {
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

/// What a receive got: the count, the host's msg_flags and the sender's address.
pub struct Received {
    pub count: u64,
    pub flags: u32,
    pub address: Vec<u8>,
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
    let message_flags = answer.data.get(..4).map_or(0, |bytes| u32::from_le_bytes(bytes.try_into().unwrap_or_default()));
    let address = answer.data.get(4..).unwrap_or_default().to_vec();
    Ok(Received { count, flags: message_flags, address })
}

/// `read` and `readv` of a socket.
pub fn receive(socket: &Socket, pieces: &[(UserAddr, u64)], flags: u32) -> SyscallResult {
    receive_from(socket, pieces, flags).map(|received| received.count)
}

pub fn sendto(fd: Fd, buffer: UserAddr, len: usize, flags: u32, address: UserAddr, address_len: u32) -> SyscallResult {
    let socket = socket_of(fd)?;
    let address = if address.is_null() { Vec::new() } else { read_address(address, address_len)? };
    send(&socket, &[(buffer, len as u64)], flags, &address)
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
    if word(&header, msghdr::CONTROL_LEN) != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    let (name, name_len) = (word(&header, msghdr::NAME), half(&header, msghdr::NAME_LEN));
    let address = if name == 0 { Vec::new() } else { read_address(UserAddr(name), name_len)? };
    let pieces = iovecs(UserAddr(word(&header, msghdr::IOV)), word(&header, msghdr::IOV_LEN))?;
    send(&socket, &pieces, flags, &address)
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
    user::write_bytes(message + msghdr::CONTROL_LEN as u64, &0u64.to_le_bytes())?;
    user::write_bytes(message + msghdr::FLAGS as u64, &received.flags.to_le_bytes())?;
    Ok(received.count)
}
