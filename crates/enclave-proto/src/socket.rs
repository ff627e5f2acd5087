//! Forwarded socket calls (`SocketRequest`, answered by `SocketResult`; `SocketReady` pushes
//! readiness). The host serves them with its own network stack, as the job's user, and never
//! blocks on one: a call that would wait answers `-EAGAIN` (`-EINPROGRESS` for `Connect`), and
//! the kernel waits for the socket's readiness itself, so a blocking call sleeps only its thread
//! and a signal can end it.
//!
//! | op | call | fields | result | data of the answer |
//! |----|------|--------|--------|--------------------|
//! | 1 | `Socket` | u32 domain, u32 type (without `SOCK_NONBLOCK`/`SOCK_CLOEXEC`), u32 protocol | handle | |
//! | 2 | `Pair` | u32 domain, u32 type, u32 protocol | first handle | the second handle, u32 |
//! | 3 | `Bind` | u32 handle, bytes address (a Linux `sockaddr`) | 0 | |
//! | 4 | `Connect` | u32 handle, bytes address | 0 | |
//! | 5 | `Listen` | u32 handle, i32 backlog | 0 | |
//! | 6 | `Accept` | u32 handle | new handle | the peer's address |
//! | 7 | `Shutdown` | u32 handle, u32 how | 0 | |
//! | 8 | `GetOption` | u32 handle, i32 level, i32 name, u32 len | 0 | the value (at most len bytes) |
//! | 9 | `SetOption` | u32 handle, i32 level, i32 name, bytes value | 0 | |
//! | 10 | `Name` | u32 handle, u8 peer (0 `getsockname`, 1 `getpeername`) | 0 | the address |
//! | 11 | `Send` | u32 handle, u32 flags (`MSG_*`), bytes address (empty: none), bytes rights (u32 handles to pass, `SCM_RIGHTS`), `list<run>` | bytes sent | |
//! | 12 | `Recv` | u32 handle, u32 flags, `list<run>` | bytes received | u32 `msg_flags`, u32 address length, the sender's address, then u32 handle, u32 events and u32 type (`SO_TYPE`) of each socket received (`SCM_RIGHTS`) |
//! | 13 | `Close` | u32 handle | (no answer) | |
//! | 14 | `Ioctl` | u32 handle, u32 request, bytes argument | the host's result | the argument as the call left it |
//! | 15 | `Interfaces` | u32 handle, u32 len | `ifc_len`: bytes of `ifreq`s given, or needed when len is 0 | the `ifreq`s (at most len bytes) |
//!
//! `Ioctl` is a read-only query on the socket whose argument is a fixed-size structure
//! ([`ioctl::argument_len`]: an `ifreq` for the interface queries, an `int` for `FIONREAD`);
//! the host refuses any other request (`-ENOTTY`) or size (`-EINVAL`). `Interfaces` is
//! `SIOCGIFCONF` (its `ifreq` array holds no pointers), at most [`ioctl::INTERFACES_MAX`] bytes.
//!
//! A `run` is `u64 gpa, u32 len`: a piece of the job's buffer in enclave memory, which the host
//! reads (`Send`) or writes (`Recv`) directly, all pieces in one host call (an iovec), so a
//! large transfer is one request. `events` in every `SocketResult` is the socket's readiness
//! (Linux `POLL*` bits) right after the call (0 for calls without a socket); `SocketReady`
//! says it again whenever it changes on the host's side. Unknown handles are `-EBADF`.

use crate::wire::{DecodeError, EncodeError, Item, List, Reader, Writer};

/// The ioctl requests a job may ask of its sockets' host (Linux x86-64 numbers): queries
/// that only read the node's interfaces or a socket's queue, never change anything.
pub mod ioctl {
    pub const FIONREAD: u32 = 0x541b;
    pub const SIOCGIFNAME: u32 = 0x8910;
    /// Served by `SocketOp::Interfaces`, not `SocketOp::Ioctl`.
    pub const SIOCGIFCONF: u32 = 0x8912;
    pub const SIOCGIFFLAGS: u32 = 0x8913;
    pub const SIOCGIFADDR: u32 = 0x8915;
    pub const SIOCGIFDSTADDR: u32 = 0x8917;
    pub const SIOCGIFBRDADDR: u32 = 0x8919;
    pub const SIOCGIFNETMASK: u32 = 0x891b;
    pub const SIOCGIFMTU: u32 = 0x8921;
    pub const SIOCGIFHWADDR: u32 = 0x8927;
    pub const SIOCGIFINDEX: u32 = 0x8933;
    pub const SIOCGIFTXQLEN: u32 = 0x8942;
    /// `struct ifreq`: a 16-byte name and a 24-byte union (no pointer in the queries here).
    pub const IFREQ_LEN: usize = 40;
    /// The most bytes of `ifreq`s one `Interfaces` answer carries (819 IPv4 interfaces).
    pub const INTERFACES_MAX: u32 = 819 * IFREQ_LEN as u32;

    /// The size of the argument `request` reads and writes back; `None` for a request the
    /// host does not answer through `SocketOp::Ioctl`.
    pub fn argument_len(request: u32) -> Option<usize> {
        match request {
            FIONREAD => Some(4),
            SIOCGIFNAME | SIOCGIFFLAGS | SIOCGIFADDR | SIOCGIFDSTADDR | SIOCGIFBRDADDR | SIOCGIFNETMASK | SIOCGIFMTU | SIOCGIFHWADDR
            | SIOCGIFINDEX | SIOCGIFTXQLEN => Some(IFREQ_LEN),
            _ => None,
        }
    }
}

/// One piece of a job's buffer in enclave memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub gpa: u64,
    pub len: u32,
}

impl<'a> Item<'a> for Run {
    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.gpa)?;
        writer.u32(self.len)
    }
    fn read(reader: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Run { gpa: reader.u64("run.gpa")?, len: reader.u32("run.len")? })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketOp<'a> {
    Socket { domain: u32, kind: u32, protocol: u32 },
    Pair { domain: u32, kind: u32, protocol: u32 },
    Bind { handle: u32, address: &'a [u8] },
    Connect { handle: u32, address: &'a [u8] },
    Listen { handle: u32, backlog: i32 },
    Accept { handle: u32 },
    Shutdown { handle: u32, how: u32 },
    GetOption { handle: u32, level: i32, name: i32, len: u32 },
    SetOption { handle: u32, level: i32, name: i32, value: &'a [u8] },
    Name { handle: u32, peer: bool },
    Send { handle: u32, flags: u32, address: &'a [u8], rights: &'a [u8], runs: List<'a, Run> },
    Recv { handle: u32, flags: u32, runs: List<'a, Run> },
    Close { handle: u32 },
    Ioctl { handle: u32, request: u32, argument: &'a [u8] },
    Interfaces { handle: u32, len: u32 },
}

impl<'a> SocketOp<'a> {
    /// The socket the call is about (`None` for the calls that make sockets).
    pub fn handle(&self) -> Option<u32> {
        match *self {
            SocketOp::Socket { .. } | SocketOp::Pair { .. } => None,
            SocketOp::Bind { handle, .. }
            | SocketOp::Connect { handle, .. }
            | SocketOp::Listen { handle, .. }
            | SocketOp::Accept { handle }
            | SocketOp::Shutdown { handle, .. }
            | SocketOp::GetOption { handle, .. }
            | SocketOp::SetOption { handle, .. }
            | SocketOp::Name { handle, .. }
            | SocketOp::Send { handle, .. }
            | SocketOp::Recv { handle, .. }
            | SocketOp::Close { handle }
            | SocketOp::Ioctl { handle, .. }
            | SocketOp::Interfaces { handle, .. } => Some(handle),
        }
    }

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        match *self {
            SocketOp::Socket { domain, kind, protocol } | SocketOp::Pair { domain, kind, protocol } => {
                w.u8(if matches!(self, SocketOp::Socket { .. }) { 1 } else { 2 })?;
                w.u32(domain)?;
                w.u32(kind)?;
                w.u32(protocol)
            }
            SocketOp::Bind { handle, address } | SocketOp::Connect { handle, address } => {
                w.u8(if matches!(self, SocketOp::Bind { .. }) { 3 } else { 4 })?;
                w.u32(handle)?;
                w.bytes(address, "address")
            }
            SocketOp::Listen { handle, backlog } => {
                w.u8(5)?;
                w.u32(handle)?;
                w.i32(backlog)
            }
            SocketOp::Accept { handle } => {
                w.u8(6)?;
                w.u32(handle)
            }
            SocketOp::Shutdown { handle, how } => {
                w.u8(7)?;
                w.u32(handle)?;
                w.u32(how)
            }
            SocketOp::GetOption { handle, level, name, len } => {
                w.u8(8)?;
                w.u32(handle)?;
                w.i32(level)?;
                w.i32(name)?;
                w.u32(len)
            }
            SocketOp::SetOption { handle, level, name, value } => {
                w.u8(9)?;
                w.u32(handle)?;
                w.i32(level)?;
                w.i32(name)?;
                w.bytes(value, "value")
            }
            SocketOp::Name { handle, peer } => {
                w.u8(10)?;
                w.u32(handle)?;
                w.u8(peer as u8)
            }
            SocketOp::Send { handle, flags, address, rights, runs } => {
                w.u8(11)?;
                w.u32(handle)?;
                w.u32(flags)?;
                w.bytes(address, "address")?;
                w.bytes(rights, "rights")?;
                runs.write(w, "runs")
            }
            SocketOp::Recv { handle, flags, runs } => {
                w.u8(12)?;
                w.u32(handle)?;
                w.u32(flags)?;
                runs.write(w, "runs")
            }
            SocketOp::Close { handle } => {
                w.u8(13)?;
                w.u32(handle)
            }
            SocketOp::Ioctl { handle, request, argument } => {
                w.u8(14)?;
                w.u32(handle)?;
                w.u32(request)?;
                w.bytes(argument, "argument")
            }
            SocketOp::Interfaces { handle, len } => {
                w.u8(15)?;
                w.u32(handle)?;
                w.u32(len)
            }
        }
    }

    pub(crate) fn read(r: &mut Reader<'a>) -> Result<SocketOp<'a>, DecodeError> {
        Ok(match r.u8("op")? {
            1 => SocketOp::Socket { domain: r.u32("domain")?, kind: r.u32("type")?, protocol: r.u32("protocol")? },
            2 => SocketOp::Pair { domain: r.u32("domain")?, kind: r.u32("type")?, protocol: r.u32("protocol")? },
            3 => SocketOp::Bind { handle: r.u32("handle")?, address: r.bytes("address")? },
            4 => SocketOp::Connect { handle: r.u32("handle")?, address: r.bytes("address")? },
            5 => SocketOp::Listen { handle: r.u32("handle")?, backlog: r.i32("backlog")? },
            6 => SocketOp::Accept { handle: r.u32("handle")? },
            7 => SocketOp::Shutdown { handle: r.u32("handle")?, how: r.u32("how")? },
            8 => SocketOp::GetOption { handle: r.u32("handle")?, level: r.i32("level")?, name: r.i32("name")?, len: r.u32("len")? },
            9 => SocketOp::SetOption { handle: r.u32("handle")?, level: r.i32("level")?, name: r.i32("name")?, value: r.bytes("value")? },
            10 => SocketOp::Name { handle: r.u32("handle")?, peer: r.u8("peer")? != 0 },
            11 => SocketOp::Send {
                handle: r.u32("handle")?,
                flags: r.u32("flags")?,
                address: r.bytes("address")?,
                rights: match r.bytes("rights")? {
                    rights if rights.len() % 4 == 0 => rights,
                    _ => return Err(DecodeError::Truncated { field: "rights" }),
                },
                runs: List::read(r, "runs")?,
            },
            12 => SocketOp::Recv { handle: r.u32("handle")?, flags: r.u32("flags")?, runs: List::read(r, "runs")? },
            13 => SocketOp::Close { handle: r.u32("handle")? },
            14 => SocketOp::Ioctl { handle: r.u32("handle")?, request: r.u32("request")?, argument: r.bytes("argument")? },
            15 => SocketOp::Interfaces { handle: r.u32("handle")?, len: r.u32("len")? },
            other => return Err(DecodeError::UnknownFileOp(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ioctl;
    use crate::{EnclaveMessage, HostMessage, List, Run, SocketOp};

    #[test]
    fn socket_messages_round_trip_and_bad_ones_are_refused() {
        let runs = [Run { gpa: 0x1000, len: 4096 }, Run { gpa: 0x9000, len: 12 }];
        let ops = [
            SocketOp::Socket { domain: 2, kind: 1, protocol: 0 },
            SocketOp::Pair { domain: 1, kind: 2, protocol: 0 },
            SocketOp::Bind { handle: 3, address: &[2, 0, 0, 80, 127, 0, 0, 1] },
            SocketOp::Connect { handle: 3, address: &[] },
            SocketOp::Listen { handle: 3, backlog: -1 },
            SocketOp::Accept { handle: 3 },
            SocketOp::Shutdown { handle: 3, how: 2 },
            SocketOp::GetOption { handle: 3, level: 1, name: 4, len: 4 },
            SocketOp::SetOption { handle: 3, level: 1, name: 2, value: &[1, 0, 0, 0] },
            SocketOp::Name { handle: 3, peer: true },
            SocketOp::Send { handle: 3, flags: 0x4000, address: &[1, 0], rights: &[5, 0, 0, 0], runs: List::new(&runs) },
            SocketOp::Recv { handle: 3, flags: 0x40, runs: List::new(&runs) },
            SocketOp::Close { handle: 3 },
            SocketOp::Ioctl { handle: 3, request: ioctl::SIOCGIFFLAGS, argument: &[b'l', b'o', 0, 0] },
            SocketOp::Interfaces { handle: 3, len: 400 },
        ];
        let mut buffer = [0u8; 256];
        for op in ops {
            let message = EnclaveMessage::SocketRequest { job: 7, request: 9, op };
            let length = message.encode(&mut buffer).unwrap();
            assert_eq!(EnclaveMessage::decode(&buffer[..length]), Ok(message));
            for cut in 0..length {
                assert!(EnclaveMessage::decode(&buffer[..cut]).is_err(), "{op:?} cut at {cut}");
            }
        }
        for message in [
            HostMessage::SocketResult { job: 1, request: 2, result: -111, events: 0x18, data: b"addr" },
            HostMessage::SocketReady { job: 1, handle: 5, events: 1 },
        ] {
            let length = message.encode(&mut buffer).unwrap();
            assert_eq!(HostMessage::decode(&buffer[..length]), Ok(message));
        }
        let message = EnclaveMessage::SocketRequest { job: 1, request: 1, op: SocketOp::Close { handle: 1 } };
        let length = message.encode(&mut buffer).unwrap();
        buffer[10] = 99;
        assert!(EnclaveMessage::decode(&buffer[..length]).is_err(), "an unknown op");
    }

    #[test]
    fn only_read_only_queries_are_whitelisted() {
        assert_eq!(ioctl::argument_len(ioctl::SIOCGIFFLAGS), Some(ioctl::IFREQ_LEN));
        assert_eq!(ioctl::argument_len(ioctl::SIOCGIFINDEX), Some(40));
        assert_eq!(ioctl::argument_len(ioctl::FIONREAD), Some(4));
        // SIOCGIFCONF has its own op; SIOCSIFFLAGS, SIOCSIFADDR, SIOCETHTOOL, SIOCADDRT and
        // FIONBIO (kept by the enclave) are not passed on.
        for request in [ioctl::SIOCGIFCONF, 0x8914, 0x8916, 0x8946, 0x890b, 0x5421, 0] {
            assert_eq!(ioctl::argument_len(request), None, "{request:#x}");
        }
        assert!(ioctl::INTERFACES_MAX as usize + 64 < crate::MAX_MESSAGE_LEN);
    }
}
