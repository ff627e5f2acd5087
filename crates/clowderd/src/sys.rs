//! Thin wrappers over the Linux calls std does not offer: memfd, eventfd, poll, openat2 and the
//! *at family on a directory descriptor. Each wrapper returns owned files or io::Result.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::Duration;

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// An anonymous memory file (sealed to nothing; the caller sizes it).
pub fn memfd(name: &str) -> io::Result<File> {
    let name = c_string(name)?;
    // SAFETY: the name is a valid C string; the returned descriptor is ours.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub fn eventfd() -> io::Result<File> {
    // SAFETY: no pointers; the returned descriptor is ours.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Adds one to an eventfd (a doorbell or an interrupt).
pub fn signal_eventfd(eventfd: &File) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a local array.
    let written = unsafe { libc::write(eventfd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if written == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Clears a non-blocking eventfd's count, returning whether it was signalled.
pub fn drain_eventfd(eventfd: &File) -> bool {
    let mut count = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a local array.
    unsafe { libc::read(eventfd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) == 8 }
}

/// Whether the other end of the stream socket `fd` has hung up (closed or shut down its
/// writing side); does not wait.
pub fn peer_hung_up(fd: RawFd) -> bool {
    let mut poll = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd we own.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Waits until `fd` is readable or `timeout` passes; true if readable.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one pollfd we own.
    match unsafe { libc::poll(&mut poll, 1, millis) } {
        n if n < 0 => {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(error)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// The kernel's `struct open_how` (libc's is non-exhaustive, so it cannot be built literally).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `path` (relative) beneath the directory `dir`: the kernel refuses `..` and symbolic
/// links that leave it, absolute paths and magic links, so the result stays inside `dir`.
pub fn open_beneath(dir: &File, path: &str, flags: i32, mode: u32) -> io::Result<File> {
    let path = c_string(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { mode as u64 & 0o7777 } else { 0 },
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 reads the path and the open_how we own, of the size we pass.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd as RawFd) })
}

/// unlinkat / mkdirat on a name inside `dir` (the caller opened `dir` beneath the root).
pub fn unlink_in(dir: &File, name: &str) -> io::Result<()> {
    let name = c_string(name)?;
    // SAFETY: a valid C string and a directory descriptor we hold.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
}

pub fn mkdir_in(dir: &File, name: &str, mode: u32) -> io::Result<()> {
    let name = c_string(name)?;
    // SAFETY: a valid C string and a directory descriptor we hold.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), (mode & 0o7777) as libc::mode_t) }).map(drop)
}

/// `kill(pid, signal)`.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    // SAFETY: no pointers.
    check(unsafe { libc::kill(pid as libc::pid_t, signal) }).map(drop)
}

/// Makes this thread's file-system checks (and the owner of files it creates) those of
/// `uid`/`gid` until dropped, so a root daemon acting for a user cannot reach further than the
/// user could. `setfsuid`/`setfsgid` change only the calling thread; supplementary groups are
/// not taken on, which can only refuse more.
pub struct FsIdentity {
    previous_uid: u32,
    previous_gid: u32,
}

impl FsIdentity {
    pub fn assume(uid: u32, gid: u32) -> FsIdentity {
        // SAFETY: no pointers; the calls return the previous ids. The group goes first: once
        // the uid is unprivileged the gid could not be changed any more.
        unsafe {
            let previous_gid = libc::setfsgid(gid) as u32;
            let previous_uid = libc::setfsuid(uid) as u32;
            FsIdentity { previous_uid, previous_gid }
        }
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // SAFETY: as in `assume`, in reverse order.
        unsafe {
            libc::setfsuid(self.previous_uid);
            libc::setfsgid(self.previous_gid);
        }
    }
}
