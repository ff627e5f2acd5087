//! The Linux calls std does not offer, for the daemon and the XEMEM broker, on `rustix`:
//! memfds and eventfds, poll, openat2 and the *at family on a directory descriptor, signals,
//! SOCK_SEQPACKET Unix sockets with SCM_RIGHTS and SO_PEERCRED, fstat and ftruncate, the
//! descriptor limit and randomness. What rustix lacks is in [`fs_identity`] and [`signals`],
//! the two places with unsafe code. Each wrapper returns owned descriptors or `io::Result`.

mod dirents;
mod fs_identity;
mod seqpacket;
mod signals;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fs::{AtFlags, MemfdFlags, Mode, OFlags, ResolveFlags};

pub use dirents::read_directory;
pub use fs_identity::FsIdentity;
pub use seqpacket::{accept, connect, listen, peer, receive, send, set_receive_timeout, Peer, MAX_FDS};
pub use signals::TerminationSignals;

/// An anonymous memory file (sealed to nothing; the caller sizes it).
pub fn memfd(name: &str) -> io::Result<File> {
    Ok(rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC)?.into())
}

/// A non-blocking eventfd with a count of 0.
pub fn eventfd() -> io::Result<File> {
    Ok(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?.into())
}

/// Adds one to an eventfd (a doorbell or an interrupt).
pub fn signal_eventfd(eventfd: &File) -> io::Result<()> {
    match rustix::io::write(eventfd, &1u64.to_ne_bytes())? {
        8 => Ok(()),
        _ => Err(io::ErrorKind::WriteZero.into()),
    }
}

/// Clears a non-blocking eventfd's count, returning whether it was signalled.
pub fn drain_eventfd(eventfd: &File) -> bool {
    let mut count = [0u8; 8];
    matches!(rustix::io::read(eventfd, &mut count), Ok(8))
}

/// Waits until `fd` is readable (or hung up) or `timeout` passes; true if readable. A signal
/// does not end the wait (the wait starts over).
pub fn wait_readable(fd: impl AsFd, timeout: Duration) -> io::Result<bool> {
    let timeout = rustix::event::Timespec::try_from(timeout).unwrap_or(rustix::event::Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
    loop {
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(ready) => return Ok(ready > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

/// Opens `path` from the directory `dir` as openat(2) would (an absolute path ignores `dir`),
/// or, when `beneath`, only beneath `dir`: then the kernel refuses `..` and symbolic links that
/// leave it, absolute paths and magic links (EXDEV), so the result stays inside `dir`.
/// `flags` and `mode` are open(2)'s; the mode counts only when creating.
pub fn open_at(dir: &File, path: &str, flags: i32, mode: u32, beneath: bool) -> io::Result<File> {
    let flags = OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC;
    // O_TMPFILE includes O_DIRECTORY's bit: only the whole of it asks for a mode.
    let mode = if flags.contains(OFlags::CREATE) || flags.contains(OFlags::TMPFILE) {
        Mode::from_bits_truncate(mode & 0o7777)
    } else {
        Mode::empty()
    };
    let resolve = if beneath { ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS } else { ResolveFlags::empty() };
    Ok(rustix::fs::openat2(dir, path, flags, mode, resolve)?.into())
}

/// unlinkat of `path` from `dir` (a name inside a directory opened beneath a root, or any
/// path the caller may reach).
pub fn unlink_in(dir: &File, path: &str) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, path, AtFlags::empty())?)
}

/// mkdirat of `path` from `dir` (as [`unlink_in`]).
pub fn mkdir_in(dir: &File, path: &str, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(dir, path, Mode::from_bits_truncate(mode & 0o7777))?)
}

/// `kill(pid, signal)`; a pid of 0 (which would mean our own process group) or beyond the pid
/// range, and an unknown signal, are InvalidInput.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    let signal = rustix::process::Signal::from_named_raw(signal);
    match (pid, signal) {
        (Some(pid), Some(signal)) => Ok(rustix::process::kill_process(pid, signal)?),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "no such process id or signal")),
    }
}

/// Size, device and inode of a descriptor, and whether it is a regular file.
pub struct FileInfo {
    pub size: u64,
    pub device: u64,
    pub inode: u64,
    pub regular: bool,
}

pub fn file_info(fd: impl AsFd) -> io::Result<FileInfo> {
    let st = rustix::fs::fstat(fd)?;
    Ok(FileInfo {
        size: st.st_size as u64,
        device: st.st_dev,
        inode: st.st_ino,
        regular: rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile,
    })
}

/// The file system of a descriptor as the kernel writes Linux's `struct statfs` (x86-64: 120
/// bytes), for a job whose kernel forwards `statfs` here: its bytes as they are (libc's
/// `statfs` hides `f_fsid`).
pub fn statfs_record(fd: impl AsFd) -> io::Result<[u8; 120]> {
    const { assert!(std::mem::size_of::<libc::statfs>() == 120) };
    let mut record = [0u8; 120];
    // SAFETY: fstatfs writes one struct statfs, whose size is asserted above, into the buffer.
    let result = unsafe { libc::syscall(libc::SYS_fstatfs, std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd()), record.as_mut_ptr()) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(record)
}

/// Cuts a file to zero length: every mapping of it beyond the new end raises SIGBUS on access.
pub fn truncate_to_zero(fd: &OwnedFd) -> io::Result<()> {
    Ok(rustix::fs::ftruncate(fd, 0)?)
}

/// Raises the soft limit on open descriptors to the hard limit.
pub fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let _ = setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum });
    }
}

/// A fresh instance value for a name server or broker (`xemem::ids::IdCounter`): eight random
/// bytes from the kernel, or, if they cannot be had, the clock mixed with the pid (which still
/// differs from one start of the daemon to the next).
pub fn random_instance() -> u64 {
    let mut bytes = [0u8; 8];
    if matches!(rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()), Ok(8)) {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests;
