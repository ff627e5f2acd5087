//! A job's socket helper (`clowderd --socket-helper`, started by `sockets`): it becomes the
//! job's user first (RLIMIT_NOFILE, groups, gid, uid; then not dumpable, so the user cannot
//! read the enclave's memory through it), maps the enclave's RAM, and serves the job's
//! `SocketRequest`s from its control socket with the host's sockets, all non-blocking: one
//! epoll loop watches the control socket and every socket, and tells the enclave
//! (`SocketReady`) when a socket's readiness changes from what it last said. Data moves
//! between a socket and the job's buffers in enclave memory in one sendmsg/recvmsg per request.
//!
//! Written against libc: the calls take raw `sockaddr` bytes and iovecs into the mapped RAM as
//! the enclave gave them, which typed wrappers (std::net, rustix's SocketAddrAny) would only
//! parse and rebuild.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;

use enclave_proto::socket::ioctl::{self as requests, INTERFACES_MAX, SIOCGIFCONF};
use enclave_proto::{EnclaveMessage, HostMessage, List, Run, SocketOp, MAX_MESSAGE_LEN};

use crate::guest_ram::{GuestRam, RamRange};
use crate::sockets::{CONTROL_FD, MEMORY_FD};
use crate::sys;

/// `poll` events reported to the enclave.
const WATCHED: i16 = libc::POLLIN | libc::POLLOUT | libc::POLLPRI | libc::POLLRDHUP;
/// No address is longer (`struct sockaddr_storage`).
const ADDRESS_MAX: usize = 128;
/// The most pieces one send or receive names.
const MAX_RUNS: usize = 1024;
/// The most descriptors one message passes (Linux's SCM_MAX_FD is 253).
const MAX_RIGHTS: usize = 64;
/// epoll data of the control socket.
const CONTROL: u64 = u64::MAX;

struct Socket {
    fd: OwnedFd,
    /// The readiness the enclave last heard.
    told: u32,
}

struct Helper {
    job: u32,
    ram: GuestRam,
    control: OwnedFd,
    epoll: OwnedFd,
    sockets: HashMap<u32, Socket>,
    next_handle: u32,
    out: Vec<u8>,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// A libc result as the protocol's: the value, or a negated errno.
fn checked(result: isize) -> Result<i64, i32> {
    if result < 0 {
        Err(errno())
    } else {
        Ok(result as i64)
    }
}

fn readiness(fd: RawFd) -> u32 {
    let mut entry = libc::pollfd { fd, events: WATCHED, revents: 0 };
    // SAFETY: poll reads and writes the one entry we own.
    if unsafe { libc::poll(&mut entry, 1, 0) } < 0 {
        return 0;
    }
    entry.revents as u16 as u32
}

/// Parses `uid gid groups nofile ranges reserved` (after the job) and becomes the user.
fn become_user(args: &[String]) -> Result<(), String> {
    let number = |text: &str, what: &str| text.parse::<u64>().map_err(|_| format!("bad {what} {text:?}"));
    let [uid, gid, groups, files] = [&args[0], &args[1], &args[2], &args[3]];
    let (uid, gid) = (number(uid, "uid")? as libc::uid_t, number(gid, "gid")? as libc::gid_t);
    let groups: Vec<libc::gid_t> =
        groups.split(',').filter(|g| !g.is_empty()).map(|g| number(g, "group").map(|g| g as libc::gid_t)).collect::<Result<_, _>>()?;
    let (soft, hard) = files.split_once(':').ok_or("bad descriptor limit")?;
    let limit = libc::rlimit64 { rlim_cur: number(soft, "limit")?, rlim_max: number(hard, "limit")? };
    // SAFETY: plain system calls on values we own; each result is checked.
    unsafe {
        if libc::setrlimit64(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(format!("cannot take the user's descriptor limit: {}", std::io::Error::last_os_error()));
        }
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setresgid(gid, gid, gid) != 0 || libc::setresuid(uid, uid, uid) != 0
        {
            return Err(format!("cannot become the job's user {uid}: {}", std::io::Error::last_os_error()));
        }
        if uid != 0 && (libc::setresuid(0, 0, 0) == 0 || libc::geteuid() != uid) {
            return Err("the daemon's rights were not dropped".into());
        }
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    Ok(())
}

fn parse_ram(ranges: &str, reserved: &str) -> Result<(Vec<RamRange>, (u64, u64)), String> {
    let numbers = |text: &str| {
        text.split(':').map(|n| n.parse::<u64>().map_err(|_| format!("bad RAM layout {text:?}"))).collect::<Result<Vec<_>, _>>()
    };
    let ranges = ranges
        .split(',')
        .map(|range| match numbers(range)?[..] {
            [gpa, size, file_offset] => Ok(RamRange { gpa, size, file_offset }),
            _ => Err(format!("bad RAM range {range:?}")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    match numbers(reserved)?[..] {
        [start, len] => Ok((ranges, (start, len))),
        _ => Err(format!("bad reserved range {reserved:?}")),
    }
}

/// `clowderd --socket-helper JOB UID GID GROUPS SOFT:HARD RANGES RESERVED`, with the control
/// socket and the RAM memfd at `CONTROL_FD` and `MEMORY_FD`.
pub fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("socket helper: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    if args.len() != 7 {
        return Err(format!("expected 7 arguments, got {}", args.len()));
    }
    let job = args[0].parse().map_err(|_| format!("bad job {:?}", args[0]))?;
    become_user(&args[1..5])?;
    // SAFETY: the daemon put these descriptors here for this process alone.
    let (control, memfd) = unsafe { (OwnedFd::from_raw_fd(CONTROL_FD), File::from_raw_fd(MEMORY_FD)) };
    let (ranges, reserved) = parse_ram(&args[5], &args[6])?;
    let ram = GuestRam::map(&memfd, ranges, reserved).map_err(|e| format!("cannot map the enclave's RAM: {e}"))?;
    drop(memfd);
    // SAFETY: epoll_create1 makes a fresh descriptor, owned from here on.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        return Err(format!("epoll: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
    let mut helper = Helper { job, ram, control, epoll, sockets: HashMap::new(), next_handle: 1, out: vec![0; MAX_MESSAGE_LEN] };
    helper.watch(helper.control.as_raw_fd(), CONTROL, libc::EPOLLIN as u32).map_err(|e| format!("epoll: {e}"))?;
    helper.serve()
}

impl Helper {
    fn watch(&self, fd: RawFd, data: u64, events: u32) -> Result<(), i32> {
        let mut event = libc::epoll_event { events, u64: data };
        // SAFETY: epoll_ctl reads the event we own.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    fn serve(&mut self) -> Result<(), String> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut packet = vec![0u8; MAX_MESSAGE_LEN];
        loop {
            // SAFETY: epoll_wait writes at most `events.len()` entries into the vector we own.
            let count = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, -1) };
            if count < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Err(format!("epoll_wait: {}", std::io::Error::last_os_error()));
            }
            for event in &events[..count as usize] {
                let data = event.u64;
                if data == CONTROL {
                    match sys::receive(&self.control, &mut packet) {
                        Ok((0, _)) => return Ok(()),
                        Ok((length, _)) => self.request(&packet[..length])?,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(format!("control socket: {e}")),
                    }
                } else {
                    self.report(data as u32)?;
                }
            }
        }
    }

    fn send(&mut self, message: &HostMessage<'_>) -> Result<(), String> {
        let length = message.encode(&mut self.out).map_err(|e| format!("encoding {message:?}: {e}"))?;
        sys::send(&self.control, &self.out[..length], &[]).map_err(|e| format!("control socket: {e}"))
    }

    /// Tells the enclave socket `handle`'s readiness if it changed since it last heard.
    fn report(&mut self, handle: u32) -> Result<(), String> {
        let Some(socket) = self.sockets.get_mut(&handle) else { return Ok(()) };
        let events = readiness(socket.fd.as_raw_fd());
        if events == socket.told {
            return Ok(());
        }
        socket.told = events;
        let job = self.job;
        self.send(&HostMessage::SocketReady { job, handle, events })
    }

    /// The readiness of `handle` now, which the enclave hears with the answer.
    fn told(&mut self, handle: u32) -> u32 {
        match self.sockets.get_mut(&handle) {
            Some(socket) => {
                socket.told = readiness(socket.fd.as_raw_fd());
                socket.told
            }
            None => 0,
        }
    }

    fn request(&mut self, bytes: &[u8]) -> Result<(), String> {
        let (request, op) = match EnclaveMessage::decode(bytes) {
            Ok(EnclaveMessage::SocketRequest { job, request, op }) if job == self.job => (request, op),
            _ => return Ok(()),
        };
        if let SocketOp::Close { handle } = op {
            if let Some(socket) = self.sockets.remove(&handle) {
                // Out of the epoll set now: a descriptor passed elsewhere (SCM_RIGHTS, in flight)
                // keeps the socket open, and its registration with it, under a number this
                // process may reuse.
                // SAFETY: epoll_ctl on descriptors this process owns.
                unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, socket.fd.as_raw_fd(), std::ptr::null_mut()) };
            }
            return Ok(());
        }
        let mut data = Vec::new();
        let result = self.call(&op, &mut data);
        // The answer is about the socket the call made, or the one it was on.
        let about = match (&op, &result) {
            (SocketOp::Socket { .. } | SocketOp::Pair { .. }, Ok(handle)) => Some(*handle as u32),
            _ => op.handle(),
        };
        let events = about.map_or(0, |handle| self.told(handle));
        let result = result.unwrap_or_else(|errno| -(errno as i64));
        let job = self.job;
        self.send(&HostMessage::SocketResult { job, request, result, events, data: &data })?;
        // A listener's readiness after an accept, which the answer (about the new socket) did
        // not carry.
        if let (SocketOp::Accept { handle }, true) = (op, result >= 0) {
            self.report(handle)?;
        }
        Ok(())
    }

    /// The descriptors an `SCM_RIGHTS` message brought.
    fn rights_in(message: &libc::msghdr) -> Vec<RawFd> {
        let mut fds = Vec::new();
        // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within its length.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let count = ((*header).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                    let data = libc::CMSG_DATA(header).cast::<RawFd>();
                    fds.extend((0..count).map(|index| data.add(index).read_unaligned()));
                }
                header = libc::CMSG_NXTHDR(message, header);
            }
        }
        fds
    }

    /// Takes the sockets an `SCM_RIGHTS` message brought as the job's (non-blocking, as all
    /// its sockets); anything else a host peer passed is closed (the job sees MSG_CTRUNC).
    fn received_rights(&mut self, fds: Vec<RawFd>) -> Vec<u32> {
        let mut handles = Vec::new();
        for fd in fds {
            // SAFETY: fstat and fcntl on a descriptor recvmsg just gave this process.
            let usable = unsafe {
                let mut status: libc::stat = std::mem::zeroed();
                libc::fstat(fd, &mut status) == 0
                    && status.st_mode & libc::S_IFMT == libc::S_IFSOCK
                    && libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) == 0
            };
            if !usable {
                // SAFETY: ours to close.
                unsafe { libc::close(fd) };
                continue;
            }
            if let Ok(handle) = self.adopt(fd) {
                handles.push(handle);
            }
        }
        handles
    }

    fn adopt(&mut self, fd: RawFd) -> Result<u32, i32> {
        // SAFETY: `fd` is a fresh descriptor the caller made and hands over.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let handle = self.next_handle;
        self.next_handle = self.next_handle.checked_add(1).ok_or(libc::EMFILE)?;
        self.watch(fd.as_raw_fd(), handle as u64, (WATCHED as u16 as u32) | libc::EPOLLET as u32)?;
        self.sockets.insert(handle, Socket { fd, told: 0 });
        Ok(handle)
    }

    /// A socket's type (`SO_TYPE`: stream, datagram, ...), 0 if it cannot be told.
    fn kind(&self, handle: u32) -> u32 {
        let (mut kind, mut len) = (0i32, 4 as libc::socklen_t);
        let Ok(fd) = self.fd(handle) else { return 0 };
        // SAFETY: getsockopt writes at most `len` bytes into the integer we own.
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, (&mut kind as *mut i32).cast(), &mut len) };
        kind as u32
    }

    fn fd(&self, handle: u32) -> Result<RawFd, i32> {
        self.sockets.get(&handle).map(|socket| socket.fd.as_raw_fd()).ok_or(libc::EBADF)
    }

    /// The iovec of the job's buffer pieces, each checked to be enclave RAM.
    fn iovecs(&self, runs: List<'_, Run>) -> Result<Vec<libc::iovec>, i32> {
        if runs.len() > MAX_RUNS {
            return Err(libc::EMSGSIZE);
        }
        runs.iter()
            .map(|run| {
                let base = self.ram.host_range(run.gpa, run.len as u64).map_err(|_| libc::EFAULT)?;
                Ok(libc::iovec { iov_base: base.cast(), iov_len: run.len as usize })
            })
            .collect()
    }

    fn call(&mut self, op: &SocketOp<'_>, data: &mut Vec<u8>) -> Result<i64, i32> {
        let address_len =
            |address: &[u8]| if address.len() > ADDRESS_MAX { Err(libc::EINVAL) } else { Ok(address.len() as libc::socklen_t) };
        match *op {
            SocketOp::Socket { domain, kind, protocol } | SocketOp::Pair { domain, kind, protocol } => {
                match domain as i32 {
                    libc::AF_UNIX | libc::AF_INET | libc::AF_INET6 => {}
                    // Routing-table reads (`getifaddrs`: the node's interfaces as the user sees
                    // them); other netlink families (audit, uevents, ...) are not passed on.
                    libc::AF_NETLINK if protocol as i32 == libc::NETLINK_ROUTE => {}
                    libc::AF_NETLINK => return Err(libc::EPROTONOSUPPORT),
                    _ => return Err(libc::EAFNOSUPPORT),
                }
                let kind = kind as i32 | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
                if let SocketOp::Socket { .. } = op {
                    // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                    let fd = unsafe { libc::socket(domain as i32, kind, protocol as i32) };
                    return self.adopt(checked(fd as isize)? as RawFd).map(i64::from);
                }
                let mut pair = [0; 2];
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                checked(unsafe { libc::socketpair(domain as i32, kind, protocol as i32, pair.as_mut_ptr()) } as isize)?;
                let first = self.adopt(pair[0])?;
                let second = self.adopt(pair[1])?;
                data.extend_from_slice(&second.to_le_bytes());
                data.extend_from_slice(&self.told(second).to_le_bytes());
                Ok(first as i64)
            }
            SocketOp::Bind { handle, address } | SocketOp::Connect { handle, address } => {
                let fd = self.fd(handle)?;
                let len = address_len(address)?;
                let call = if matches!(op, SocketOp::Bind { .. }) { libc::bind } else { libc::connect };
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                checked(unsafe { call(fd, address.as_ptr().cast(), len) } as isize)
            }
            // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
            SocketOp::Listen { handle, backlog } => checked(unsafe { libc::listen(self.fd(handle)?, backlog) } as isize),
            // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
            SocketOp::Shutdown { handle, how } => checked(unsafe { libc::shutdown(self.fd(handle)?, how as i32) } as isize),
            SocketOp::Accept { handle } => {
                let mut address = [0u8; ADDRESS_MAX];
                let mut len = ADDRESS_MAX as libc::socklen_t;
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                let fd = unsafe {
                    libc::accept4(self.fd(handle)?, address.as_mut_ptr().cast(), &mut len, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
                };
                let accepted = self.adopt(checked(fd as isize)? as RawFd)?;
                data.extend_from_slice(&self.told(accepted).to_le_bytes());
                data.extend_from_slice(&address[..(len as usize).min(ADDRESS_MAX)]);
                Ok(accepted as i64)
            }
            SocketOp::GetOption { handle, level, name, len } => {
                let mut value = vec![0u8; (len as usize).min(256)];
                let mut len = value.len() as libc::socklen_t;
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                checked(unsafe { libc::getsockopt(self.fd(handle)?, level, name, value.as_mut_ptr().cast(), &mut len) } as isize)?;
                data.extend_from_slice(&value[..(len as usize).min(value.len())]);
                Ok(0)
            }
            SocketOp::SetOption { handle, level, name, value } => {
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                checked(unsafe { libc::setsockopt(self.fd(handle)?, level, name, value.as_ptr().cast(), value.len() as libc::socklen_t) }
                    as isize)
            }
            SocketOp::Name { handle, peer } => {
                let mut address = [0u8; ADDRESS_MAX];
                let mut len = ADDRESS_MAX as libc::socklen_t;
                let call = if peer { libc::getpeername } else { libc::getsockname };
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                checked(unsafe { call(self.fd(handle)?, address.as_mut_ptr().cast(), &mut len) } as isize)?;
                data.extend_from_slice(&address[..(len as usize).min(ADDRESS_MAX)]);
                Ok(0)
            }
            SocketOp::Send { handle, flags, address, rights, runs } => {
                let fd = self.fd(handle)?;
                let mut iovecs = self.iovecs(runs)?;
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
                if !address.is_empty() {
                    message.msg_name = address.as_ptr() as *mut libc::c_void;
                    message.msg_namelen = address_len(address)?;
                }
                message.msg_iov = iovecs.as_mut_ptr();
                message.msg_iovlen = iovecs.len();
                let passed: Vec<RawFd> = rights
                    .chunks_exact(4)
                    .map(|handle| self.fd(u32::from_le_bytes([handle[0], handle[1], handle[2], handle[3]])))
                    .collect::<Result<_, _>>()?;
                if passed.len() > MAX_RIGHTS {
                    return Err(libc::EINVAL);
                }
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                let mut control = vec![0u8; unsafe { libc::CMSG_SPACE((passed.len() * 4) as u32) } as usize];
                if !passed.is_empty() {
                    message.msg_control = control.as_mut_ptr().cast();
                    message.msg_controllen = control.len();
                    // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                    unsafe {
                        let header = libc::CMSG_FIRSTHDR(&message);
                        (*header).cmsg_level = libc::SOL_SOCKET;
                        (*header).cmsg_type = libc::SCM_RIGHTS;
                        (*header).cmsg_len = libc::CMSG_LEN((passed.len() * 4) as u32) as usize;
                        std::ptr::copy_nonoverlapping(passed.as_ptr(), libc::CMSG_DATA(header).cast::<RawFd>(), passed.len());
                    }
                }
                // Never a SIGPIPE here: the enclave's kernel raises it in the job.
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                checked(unsafe { libc::sendmsg(fd, &message, flags as i32 | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
            }
            SocketOp::Recv { handle, flags, runs } => {
                let fd = self.fd(handle)?;
                let mut iovecs = self.iovecs(runs)?;
                let mut address = [0u8; ADDRESS_MAX];
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
                message.msg_name = address.as_mut_ptr().cast();
                message.msg_namelen = ADDRESS_MAX as libc::socklen_t;
                message.msg_iov = iovecs.as_mut_ptr();
                message.msg_iovlen = iovecs.len();
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                let mut control = vec![0u8; unsafe { libc::CMSG_SPACE((MAX_RIGHTS * 4) as u32) } as usize];
                message.msg_control = control.as_mut_ptr().cast();
                message.msg_controllen = control.len();
                // SAFETY: owned buffers or enclave RAM checked by `host_range`, with their true lengths.
                let count =
                    checked(unsafe { libc::recvmsg(fd, &mut message, flags as i32 | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) })?;
                let brought = Self::rights_in(&message);
                let kept = brought.len();
                let received = self.received_rights(brought);
                let mut message_flags = message.msg_flags as u32;
                if received.len() < kept {
                    message_flags |= libc::MSG_CTRUNC as u32;
                }
                let address = &address[..(message.msg_namelen as usize).min(ADDRESS_MAX)];
                data.extend_from_slice(&message_flags.to_le_bytes());
                data.extend_from_slice(&(address.len() as u32).to_le_bytes());
                data.extend_from_slice(address);
                for handle in received {
                    data.extend_from_slice(&handle.to_le_bytes());
                    data.extend_from_slice(&self.told(handle).to_le_bytes());
                    data.extend_from_slice(&self.kind(handle).to_le_bytes());
                }
                Ok(count)
            }
            SocketOp::Ioctl { handle, request, argument } => query(self.fd(handle)?, request, argument, data),
            SocketOp::Interfaces { handle, len } => interfaces(self.fd(handle)?, len, data),
            SocketOp::Close { .. } => Ok(0),
        }
    }
}

/// A whitelisted read-only ioctl on socket `fd` (`SocketOp::Ioctl`): the argument as the call
/// left it goes to `data`. Any other request is ENOTTY and a wrong size EINVAL, whatever the
/// job's kernel sent: nothing the job asks changes the node or makes the call read past the copy.
fn query(fd: RawFd, request: u32, argument: &[u8], data: &mut Vec<u8>) -> Result<i64, i32> {
    match requests::argument_len(request) {
        None => return Err(libc::ENOTTY),
        Some(len) if len != argument.len() => return Err(libc::EINVAL),
        Some(_) => {}
    }
    let mut value = argument.to_vec();
    // SAFETY: the request reads and writes at most `value.len()` bytes (checked above).
    let result = checked(unsafe { libc::ioctl(fd, request as libc::Ioctl, value.as_mut_ptr()) } as isize)?;
    data.extend_from_slice(&value);
    Ok(result)
}

/// SIOCGIFCONF on socket `fd` (`SocketOp::Interfaces`): at most `len` bytes of `ifreq`s (capped
/// at `INTERFACES_MAX`) to `data`, and their length; `len` 0 asks only for the length needed.
fn interfaces(fd: RawFd, len: u32, data: &mut Vec<u8>) -> Result<i64, i32> {
    let mut list = vec![0u8; len.min(INTERFACES_MAX) as usize];
    let mut conf = libc::ifconf {
        ifc_len: list.len() as libc::c_int,
        ifc_ifcu: libc::__c_anonymous_ifc_ifcu { ifcu_buf: if list.is_empty() { std::ptr::null_mut() } else { list.as_mut_ptr().cast() } },
    };
    // SAFETY: SIOCGIFCONF writes at most `ifc_len` bytes to the buffer we own (none when it is
    // NULL: then it only sets the length needed).
    checked(unsafe { libc::ioctl(fd, SIOCGIFCONF as libc::Ioctl, &mut conf) } as isize)?;
    let used = conf.ifc_len.max(0) as usize;
    data.extend_from_slice(&list[..used.min(list.len())]);
    Ok(used as i64)
}

#[cfg(test)]
mod tests {
    use super::{interfaces, query};
    use enclave_proto::socket::ioctl::{self as requests, IFREQ_LEN};
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    fn ifreq(name: &str) -> Vec<u8> {
        let mut request = vec![0u8; IFREQ_LEN];
        request[..name.len()].copy_from_slice(name.as_bytes());
        request
    }

    #[test]
    fn only_whitelisted_queries_of_their_size_reach_the_host() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = socket.as_raw_fd();
        let mut data = Vec::new();
        assert_eq!(query(fd, requests::SIOCGIFFLAGS, &ifreq("lo"), &mut data), Ok(0));
        let flags = i16::from_le_bytes([data[16], data[17]]);
        assert_eq!(flags & (libc::IFF_UP | libc::IFF_LOOPBACK) as i16, (libc::IFF_UP | libc::IFF_LOOPBACK) as i16);
        data.clear();
        assert_eq!(query(fd, requests::SIOCGIFINDEX, &ifreq("lo"), &mut data), Ok(0));
        assert_eq!(i32::from_le_bytes(data[16..20].try_into().unwrap()), 1);
        // Setters (SIOCSIFFLAGS, SIOCSIFMTU), SIOCGIFCONF (its own op) and FIONBIO are refused
        // before any call, as is a short or long argument.
        for request in [libc::SIOCSIFFLAGS as u32, libc::SIOCSIFMTU as u32, requests::SIOCGIFCONF, libc::FIONBIO as u32] {
            assert_eq!(query(fd, request, &ifreq("lo"), &mut Vec::new()), Err(libc::ENOTTY), "{request:#x}");
        }
        assert_eq!(query(fd, requests::SIOCGIFFLAGS, &ifreq("lo")[..16], &mut Vec::new()), Err(libc::EINVAL));
        assert_eq!(query(fd, requests::FIONREAD, &ifreq("lo"), &mut Vec::new()), Err(libc::EINVAL));
        assert_eq!(query(fd, requests::SIOCGIFFLAGS, &ifreq("nosuch0"), &mut Vec::new()), Err(libc::ENODEV));
    }

    #[test]
    fn the_interface_list_is_whole_entries_within_the_room_given() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = socket.as_raw_fd();
        let mut data = Vec::new();
        let needed = interfaces(fd, 0, &mut data).unwrap();
        assert!(data.is_empty() && needed > 0 && needed as usize % IFREQ_LEN == 0, "{needed}");
        assert_eq!(interfaces(fd, u32::MAX, &mut data), Ok(needed));
        assert_eq!(data.len(), needed as usize);
        assert!(data.chunks(IFREQ_LEN).any(|entry| entry.starts_with(b"lo\0") && entry[20..24] == [127, 0, 0, 1]));
        data.clear();
        assert_eq!(interfaces(fd, IFREQ_LEN as u32 + 3, &mut data), Ok(IFREQ_LEN as i64));
        assert_eq!(data.len(), IFREQ_LEN);
    }
}
