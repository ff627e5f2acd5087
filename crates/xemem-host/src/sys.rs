//! The few system calls the broker needs, with the unsafe kept here: SOCK_SEQPACKET Unix sockets
//! (one request or answer per packet, so no framing), SCM_RIGHTS, SO_PEERCRED, ftruncate, fstat;
//! and the randomness that sets a broker's ids apart from its predecessor's.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// At most this many descriptors travel with one packet (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the returned descriptor is owned from here on.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok((addr, std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t))
}

/// Binds and listens on `path` (replacing a stale socket file), readable and writable by all:
/// access to segments is checked per request against the caller's credentials, not by who may
/// connect.
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let _ = std::fs::remove_file(path);
    let (addr, len) = address(path)?;
    // SAFETY: addr is a valid sockaddr_un of length len.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: c_path is NUL-terminated.
    check(unsafe { libc::chmod(c_path.as_ptr(), 0o666) })?;
    // SAFETY: fd is a bound socket.
    check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = address(path)?;
    // SAFETY: addr is a valid sockaddr_un of length len.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(fd)
}

pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: accept4 on a listening socket; null address pointers are allowed.
        let fd = unsafe {
            libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor from accept4.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted && error.raw_os_error() != Some(libc::ECONNABORTED) {
            return Err(error);
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
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most len bytes into cred.
    check(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    })?;
    Ok(Peer { pid: cred.pid as u32, uid: cred.uid, gid: cred.gid })
}

/// Waits until `fd` is readable (or hung up); false when `timeout` passed first.
pub fn wait_readable(fd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: one pollfd we own.
        match unsafe { libc::poll(&mut poll, 1, millis) } {
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
            n if n < 0 => return Err(io::Error::last_os_error()),
            n => return Ok(n > 0),
        }
    }
}

pub fn set_receive_timeout(fd: &OwnedFd, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: timeout.subsec_micros() as libc::suseconds_t };
    // SAFETY: tv is a valid timeval for SO_RCVTIMEO.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Sends one packet with `fds` attached.
pub fn send(fd: &OwnedFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one packet"));
    }
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let space = if fds.is_empty() {
        0
    } else {
        // SAFETY: CMSG_SPACE is a pure computation.
        unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize }
    };
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; the pointers set below outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds CMSG_SPACE(len) bytes, so the first header and its
        // data fit.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(header).cast::<RawFd>(), fds.len());
        }
    }
    loop {
        // SAFETY: msg describes valid buffers.
        let sent = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Receives one packet into `buffer`; returns its length (0: the peer closed) and the
/// descriptors that came with it. A packet longer than the buffer is an error (truncated).
pub fn receive(fd: &OwnedFd, buffer: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) as usize };
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; the buffers outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    let received = loop {
        // SAFETY: msg describes valid buffers; MSG_CMSG_CLOEXEC keeps received fds out of
        // anything the broker might exec.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel filled in, within msg_controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..data_len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "packet or descriptors truncated"));
    }
    Ok((received, fds))
}

/// Size, device and inode of a descriptor, and whether it is a regular file.
pub struct FileInfo {
    pub size: u64,
    pub device: u64,
    pub inode: u64,
    pub regular: bool,
}

pub fn file_info(fd: &OwnedFd) -> io::Result<FileInfo> {
    // SAFETY: stat is plain data; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(FileInfo {
        size: st.st_size as u64,
        device: st.st_dev,
        inode: st.st_ino,
        regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
    })
}

/// Cuts a file to zero length: every mapping of it beyond the new end raises SIGBUS on access.
pub fn truncate_to_zero(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: ftruncate on an owned descriptor.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) })?;
    Ok(())
}

/// Raises the soft limit on open descriptors to the hard limit.
pub fn raise_descriptor_limit() {
    // SAFETY: rlimit is plain data; getrlimit/setrlimit read and write it.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// A fresh instance value for a name server or broker (`xemem::ids::IdCounter`): eight random
/// bytes from the kernel, or, if they cannot be read, the clock mixed with the pid (which still
/// differs from one start of the daemon to the next).
pub fn random_instance() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut random| random.read_exact(&mut bytes)).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
