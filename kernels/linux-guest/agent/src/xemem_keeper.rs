//! The keeper of guest processes' XEMEM exports (docs/xemem-pci.md). With no guest kernel
//! module nothing in the guest kernel knows that a process's pages are mapped by host (or other
//! enclaves') attachers: when the process ends, however it ends, the kernel frees them and may
//! give them to anyone, while the attachers still read and write them. So libxpmem's PCI
//! backend (xemem/src/backend_pci.c) hands this keeper, before each MAKE, pipes holding a
//! reference to every page of the export (vmsplice), then the segment's id; it drops them when
//! the process removes the segment itself. When the process's connection closes (it ended), the
//! keeper removes what it still exported through the XEMEM device's mailbox (the attachers are
//! revoked: SIGBUS on the host) and only then lets the pages go.
//!
//! The keeper also delivers, for the daemon, what a guest kernel module would (`Registry`):
//! - **SIGBUS to attachers**: libxpmem notes each attachment on the attachment board
//!   (`crate::xemem_board`, no message); when a guest process touches a placement whose segment
//!   was revoked, the VMM sees the access (it has no memory slot any more), the daemon tells
//!   the agent (`GuestEvent::Revoked`), and every process noted on that placement gets SIGBUS
//!   through a pidfd, once its pid is seen to still have the start time noted (never a process
//!   that took its pid over). A user-space sender's signal has si_code SI_USER (the kernel
//!   refuses a faked BUS_ADRERR from user space), and it comes milliseconds after the touch:
//!   reads until then give all ones. A child that inherited an attachment across fork is not
//!   signalled (only the attacher is noted).
//! - **Signals to owners**: libxpmem's `xemem_notify_fd` in the guest is an eventfd handed
//!   here (NOTIFY); each `GuestEvent::Signal` for the segment adds one to it, as the owner's
//!   descriptor counts signals on the host and in an LWK (signals before it exists are counted
//!   and added when it comes).
//!
//! The mailbox is spoken here in Rust rather than through libxpmem (C, built for the host's
//! libc, not linked into this static agent): one request, REMOVE, under the same shared word in
//! `/run` that serializes every guest process's use of the mailbox.
//!
//! Not covered: pages of an export whose process was killed between MAKE and telling the keeper
//! its id are kept (never freed, never removed) rather than risked; a process that forked after
//! exporting is seen to end only when its last copy of the connection closes.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xemem::pci::{self, GuestEvent, KEEPER_DROP as DROP, KEEPER_KEEP as KEEP, KEEPER_MADE as MADE, KEEPER_NOTIFY as NOTIFY};

use crate::xemem_board::{self, Board};

/// The abstract socket name libxpmem connects to (`CLOWDER_XEMEM_KEEPER` there).
const SOCKET_NAME: &[u8] = b"clowder-xemem-keeper";
/// What one guest process may make the keeper hold: exports, and pipes over all of them.
const MAX_EXPORTS: usize = 4096;
const MAX_PIPES: usize = 1 << 16;

/// What removes a segment: the device's mailbox, or a test's recorder.
pub trait Remover {
    /// Removes segment `segid`: `Err(errno)` when the device refused or did not answer.
    fn remove(&self, segid: i64) -> Result<(), i32>;
}

/// What carries out the daemon's events: signals and eventfd writes, or a test's recorder.
pub trait Deliver {
    /// Sends SIGBUS to process `pid` if it still has start time `start`: false when it is
    /// gone (or its pid was taken over).
    fn sigbus(&self, pid: u32, start: u64) -> bool;
    /// Adds `count` to an owner's notify eventfd.
    fn notify(&self, eventfd: &OwnedFd, count: u64);
}

/// Signals through pidfds and eventfd writes.
pub struct System;

impl Deliver for System {
    fn sigbus(&self, pid: u32, start: u64) -> bool {
        let Ok(pid) = i32::try_from(pid) else { return false };
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            return false;
        }
        // SAFETY: a fresh descriptor from pidfd_open, owned from here on.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
        // Checked after the pidfd is taken: it names the process whose start time this is.
        if xemem_board::start_time(pid as u32) != Some(start) {
            return false;
        }
        // SAFETY: pidfd_send_signal with no siginfo (the kernel fills SI_USER in).
        let sent = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGBUS, std::ptr::null::<u8>(), 0) };
        if sent != 0 {
            eprintln!("clowder-agent: xemem: SIGBUS to process {pid}: {}", std::io::Error::last_os_error());
        }
        true
    }

    fn notify(&self, eventfd: &OwnedFd, count: u64) {
        // SAFETY: an 8-byte write from a live u64 to an eventfd (EAGAIN at its limit: dropped).
        unsafe { libc::write(eventfd.as_raw_fd(), (&raw const count).cast(), 8) };
    }
}

/// A segment a guest process exported: its connection, its notify eventfd once registered,
/// and signals counted before that.
struct Owned {
    connection: u64,
    eventfd: Option<OwnedFd>,
    pending: u64,
}

#[derive(Default)]
struct Index {
    owned: HashMap<i64, Owned>,
}

/// The attachment board and every connection's exported segments, for the daemon's events.
#[derive(Default)]
pub struct Registry {
    index: Mutex<Index>,
    /// `None`: the board could not be had (no SIGBUS after a revocation).
    board: Option<Board>,
    /// The generation of each board slot whose attachment was sent its SIGBUS.
    signalled: Mutex<HashMap<usize, u32>>,
}

impl Registry {
    pub fn new(board: Option<Board>) -> Registry {
        Registry { board, ..Registry::default() }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Carries `event` out: the processes signalled or eventfds written (0: nobody to tell).
    pub fn deliver(&self, event: GuestEvent, deliver: &dyn Deliver) -> usize {
        match event {
            GuestEvent::Revoked { window_offset } => {
                let Some(board) = &self.board else { return 0 };
                // One SIGBUS per attachment: the VMM reports touches every 100 ms while the
                // process spins, and reports of touches made before the signal reached it
                // would otherwise land after its handler, wherever it has moved on to.
                let mut signalled = self.signalled.lock().unwrap_or_else(|e| e.into_inner());
                let mut count = 0;
                for noted in board.attachers(window_offset) {
                    if signalled.get(&noted.slot) == Some(&noted.generation) {
                        continue;
                    }
                    if deliver.sigbus(noted.pid, noted.start) {
                        signalled.insert(noted.slot, noted.generation);
                        count += 1;
                    } else {
                        board.free(noted);
                    }
                }
                count
            }
            GuestEvent::Signal { segid } => match self.index().owned.get_mut(&segid) {
                Some(Owned { eventfd: Some(eventfd), .. }) => {
                    deliver.notify(eventfd, 1);
                    1
                }
                Some(owned) => {
                    owned.pending = owned.pending.saturating_add(1);
                    0
                }
                None => 0,
            },
        }
    }

    /// Drops everything of `connection` (its process ended).
    fn forget(&self, connection: u64) {
        self.index().owned.retain(|_, owned| owned.connection != connection);
    }
}

/// One export of a connection: the pipes holding its pages, and its segment once made.
#[derive(Default)]
struct Held {
    segid: Option<i64>,
    pipes: Vec<OwnedFd>,
}

/// What one guest process handed the keeper.
pub struct Connection {
    id: u64,
    registry: Arc<Registry>,
    held: HashMap<u64, Held>,
    pipes: usize,
}

impl Connection {
    /// Connection `id` (unique for the agent's life).
    pub fn new(id: u64, registry: Arc<Registry>) -> Connection {
        Connection { id, registry, held: HashMap::new(), pipes: 0 }
    }

    /// One message with words `a` and `b`: `Err` for garbage (the connection is then treated
    /// as ended).
    pub fn apply(&mut self, op: u32, a: u64, b: i64, mut fds: Vec<OwnedFd>) -> Result<(), String> {
        let fds_expected = match op {
            KEEP => fds.len(),
            NOTIFY => 1,
            _ => 0,
        };
        if fds.len() != fds_expected {
            return Err(format!("op {op} carried {} descriptors", fds.len()));
        }
        let tag = a;
        if !self.held.contains_key(&tag) && (op != KEEP || self.held.len() >= MAX_EXPORTS) {
            return Err(format!("op {op} for export {tag}, unknown or one too many"));
        }
        if op == DROP {
            let gone = self.held.remove(&tag).expect("present");
            self.pipes -= gone.pipes.len();
            if let Some(segid) = gone.segid {
                self.registry.index().owned.remove(&segid);
            }
            return Ok(());
        }
        let held = self.held.entry(tag).or_default();
        match op {
            KEEP if self.pipes + fds.len() <= MAX_PIPES && held.segid.is_none() => {
                self.pipes += fds.len();
                held.pipes.extend(fds);
            }
            // A segment another process made stays its own (its signals are not taken over):
            // looked up and claimed under one lock, so two connections cannot both claim it.
            MADE if held.segid.is_none() && b > 0 => match self.registry.index().owned.entry(b) {
                Entry::Occupied(_) => return Err(format!("op {op} for export {tag}: segment {b:#x} is another process's")),
                Entry::Vacant(slot) => {
                    slot.insert(Owned { connection: self.id, eventfd: None, pending: 0 });
                    held.segid = Some(b);
                }
            },
            NOTIFY if held.segid == Some(b) => {
                let eventfd = fds.pop().expect("one descriptor");
                let mut index = self.registry.index();
                let owned = index.owned.get_mut(&b).expect("made by this connection");
                if owned.pending > 0 {
                    System.notify(&eventfd, std::mem::take(&mut owned.pending));
                }
                owned.eventfd = Some(eventfd);
            }
            _ => return Err(format!("op {op} for export {tag} out of turn")),
        }
        Ok(())
    }

    /// The process ended: removes each segment it still exported, then lets its pages go.
    /// Returns the pipes kept: of segments that could not be removed, or whose id never came.
    pub fn end(self, remover: &dyn Remover) -> Vec<OwnedFd> {
        self.registry.forget(self.id);
        let mut kept = Vec::new();
        for (_, held) in self.held {
            match held.segid.map(|segid| (segid, remover.remove(segid))) {
                // ENOENT: already gone (its owner's VM link, or a removal racing this one).
                Some((_, Ok(()) | Err(libc::ENOENT))) => {}
                Some((segid, Err(errno))) => {
                    eprintln!("clowder-agent: xemem: removing segment {segid:#x} of an ended process: errno {errno}; its pages stay held");
                    kept.extend(held.pipes);
                }
                None => kept.extend(held.pipes),
            }
        }
        kept
    }
}

/// The XEMEM PCI device's mailbox (BAR0), mapped from sysfs.
pub struct Mailbox {
    base: *mut u8,
    user: Option<*const AtomicU32>,
}

// SAFETY: the mappings live as long as the value and are touched only by volatile or atomic
// accesses, from any thread.
unsafe impl Send for Mailbox {}
// SAFETY: as for Send; the shared word serializes requests between threads and processes.
unsafe impl Sync for Mailbox {}

// The device's ids and mailbox offsets are `xemem::pci`'s (shared with the VMM and libxpmem).
const MAILBOX_SIZE: usize = pci::MAILBOX_SIZE as usize;
const DOORBELL: usize = pci::DOORBELL as usize;
const DONE: usize = pci::DONE as usize;
const OP: usize = pci::OP as usize;
const ERROR: usize = pci::ERROR as usize;
const ARGS: usize = pci::ARGS as usize;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Maps `length` bytes of `path` shared, read-write; with `create` the file is made (mode
/// 0600, as libxpmem makes it) and grown to `length` if need be.
pub(crate) fn map_file(path: &str, length: usize, create: bool) -> std::io::Result<*mut u8> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).create(create).truncate(false).mode(0o600).open(path)?;
    if create && file.metadata()?.len() < length as u64 {
        file.set_len(length as u64)?;
    }
    // SAFETY: a fresh shared mapping of an open file; the result is checked.
    let base =
        unsafe { libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(base.cast())
}

impl Mailbox {
    /// The device with clowder's ids under /sys/bus/pci/devices, if any.
    pub fn find() -> Option<Mailbox> {
        let id = |dir: &std::path::Path, file: &str| std::fs::read_to_string(dir.join(file)).ok().map(|s| s.trim().to_string());
        let device = std::fs::read_dir("/sys/bus/pci/devices").ok()?.flatten().map(|entry| entry.path()).find(|dir| {
            id(dir, "vendor") == Some(format!("{:#06x}", pci::VENDOR)) && id(dir, "device") == Some(format!("{:#06x}", pci::DEVICE))
        })?;
        let base = map_file(device.join("resource0").to_str()?, MAILBOX_SIZE, false).ok()?;
        let user = map_file("/run/xemem-pci.lock", 4096, true).ok().map(|word| word as *const AtomicU32);
        Some(Mailbox { base, user })
    }

    fn word(&self, offset: usize) -> *mut u32 {
        // SAFETY: every offset used is inside the 64 KiB mapping and 4-byte aligned.
        unsafe { self.base.add(offset).cast() }
    }

    /// Takes the mailbox as libxpmem does (the word holds the user's pid; a dead user's is taken over).
    fn take(&self, deadline: Instant) -> Result<(), i32> {
        let Some(user) = self.user else { return Ok(()) };
        // SAFETY: the word lies in a live shared mapping.
        let user = unsafe { &*user };
        let me = std::process::id();
        loop {
            match user.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(holder) if holder == me => return Ok(()),
                // SAFETY: kill with signal 0 only checks that the process exists.
                Err(holder) if unsafe { libc::kill(holder as i32, 0) } != 0 => {
                    if user.compare_exchange(holder, me, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        return Ok(());
                    }
                }
                Err(_) if Instant::now() > deadline => return Err(libc::ETIMEDOUT),
                Err(_) => std::thread::yield_now(),
            }
        }
    }

    fn give_back(&self) {
        if let Some(user) = self.user {
            // SAFETY: as in `take`.
            let _ = unsafe { &*user }.compare_exchange(std::process::id(), 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

impl Remover for Mailbox {
    fn remove(&self, segid: i64) -> Result<(), i32> {
        let deadline = Instant::now() + TIMEOUT;
        self.take(deadline)?;
        // SAFETY: volatile accesses to the guest-writable fields of the mapped mailbox; the
        // doorbell write goes last and the VMM answers it before the vCPU resumes.
        let result = unsafe {
            std::ptr::write_volatile(self.base.add(ARGS).cast::<u64>(), segid as u64);
            std::ptr::write_volatile(self.word(OP), pci::OP_REMOVE);
            let seq = std::ptr::read_volatile(self.word(DONE)).wrapping_add(1);
            std::ptr::write_volatile(self.word(DOORBELL), seq);
            loop {
                if std::ptr::read_volatile(self.word(DONE)) == seq {
                    break match std::ptr::read_volatile(self.word(ERROR)) as i32 {
                        0 => Ok(()),
                        errno => Err(errno),
                    };
                }
                if Instant::now() > deadline {
                    break Err(libc::ETIMEDOUT);
                }
                std::thread::yield_now();
            }
        };
        self.give_back();
        result
    }
}

/// A message as received: op, export tag, segment id, descriptors.
type Received = (u32, u64, i64, Vec<OwnedFd>);

/// One message and its descriptors; `None` at the end of the connection.
fn receive(socket: &OwnedFd) -> Result<Option<Received>, String> {
    let mut message = [0u8; 24];
    let mut control = [0u64; 256]; // room for 253 descriptors, aligned for cmsghdr
    let mut iov = libc::iovec { iov_base: message.as_mut_ptr().cast(), iov_len: message.len() };
    // SAFETY: a zeroed msghdr is valid; the fields set point at buffers that outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg into the buffers described above.
    let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    let mut fds = Vec::new();
    // SAFETY: the control headers the kernel wrote, walked with the CMSG macros.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                let data = libc::CMSG_DATA(header).cast::<i32>();
                fds.extend((0..count).map(|i| OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)))));
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    match got {
        0 => Ok(None),
        24 if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) == 0 => {
            let word = |at: usize| u64::from_le_bytes(message[at..at + 8].try_into().expect("8 bytes"));
            Ok(Some((word(0) as u32, word(8), word(16) as i64, fds)))
        }
        n if n < 0 => Err(format!("receiving: {}", std::io::Error::last_os_error())),
        n => Err(format!("a {n}-byte message (truncated: {})", msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0)),
    }
}

/// Serves one guest process until its connection ends; returns what must stay held.
fn serve(socket: OwnedFd, mut connection: Connection, remover: &dyn Remover) -> Vec<OwnedFd> {
    loop {
        match receive(&socket).and_then(|m| m.map(|(op, tag, segid, fds)| connection.apply(op, tag, segid, fds)).transpose()) {
            Ok(Some(())) => {}
            Ok(None) => break,
            Err(why) => {
                eprintln!("clowder-agent: xemem keeper: {why}; the process's exports are removed");
                break;
            }
        }
    }
    connection.end(remover)
}

/// Listens for libxpmem's connections on a thread of its own: the registry the daemon's events
/// are delivered through. Nothing when the guest has no XEMEM device.
pub fn start() -> Option<Arc<Registry>> {
    let mailbox = Mailbox::find()?;
    // SAFETY: socket/bind/listen on a fresh descriptor with an abstract address built here.
    let listener = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, &b) in SOCKET_NAME.iter().enumerate() {
            address.sun_path[1 + i] = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + SOCKET_NAME.len()) as libc::socklen_t;
        if fd < 0 || libc::bind(fd, (&raw const address).cast(), len) != 0 || libc::listen(fd, 16) != 0 {
            eprintln!("clowder-agent: xemem keeper: {}; exports die with their processes", std::io::Error::last_os_error());
            if fd >= 0 {
                libc::close(fd);
            }
            return None;
        }
        OwnedFd::from_raw_fd(fd)
    };
    let mailbox: &'static Mailbox = Box::leak(Box::new(mailbox));
    let board = Board::open(xemem_board::PATH)
        .map_err(|e| eprintln!("clowder-agent: xemem: {}: {e}; no SIGBUS after a revocation", xemem_board::PATH))
        .ok();
    let registry = Arc::new(Registry::new(board));
    let shared = registry.clone();
    let spawned = std::thread::Builder::new().name("xemem-keeper".into()).spawn(move || {
        // Kept for the agent's life: pages whose segments could not be removed.
        let kept = Arc::new(Mutex::new(Vec::new()));
        for id in 1.. {
            // SAFETY: accept on the listening socket; the result is checked.
            let fd = unsafe { libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
            if fd < 0 {
                continue;
            }
            // SAFETY: a fresh descriptor from accept4, owned from here on.
            let socket = unsafe { OwnedFd::from_raw_fd(fd) };
            let connection = Connection::new(id, shared.clone());
            let kept = kept.clone();
            let _ = std::thread::Builder::new().name("xemem-keeper-process".into()).spawn(move || {
                let left = serve(socket, connection, mailbox);
                kept.lock().unwrap_or_else(|e| e.into_inner()).extend(left);
            });
        }
    });
    if let Err(e) = spawned {
        eprintln!("clowder-agent: xemem keeper: starting its thread: {e}");
        return None;
    }
    Some(registry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Recorder {
        removed: RefCell<Vec<i64>>,
        answer: Option<i32>,
    }

    impl Remover for Recorder {
        fn remove(&self, segid: i64) -> Result<(), i32> {
            self.removed.borrow_mut().push(segid);
            self.answer.map_or(Ok(()), Err)
        }
    }

    /// A connection of process 1 (never signalled: the recorder only notes it).
    fn new_connection() -> Connection {
        Connection::new(1, Arc::new(Registry::default()))
    }

    /// SIGBUS and eventfd writes, noted; the processes in `alive` (pid, start time) exist.
    #[derive(Default)]
    struct Delivered {
        alive: Vec<(u32, u64)>,
        sigbus: RefCell<Vec<u32>>,
        notified: RefCell<Vec<(i32, u64)>>,
    }

    impl Deliver for Delivered {
        fn sigbus(&self, pid: u32, start: u64) -> bool {
            let alive = self.alive.contains(&(pid, start));
            if alive {
                self.sigbus.borrow_mut().push(pid);
            }
            alive
        }

        fn notify(&self, eventfd: &OwnedFd, count: u64) {
            self.notified.borrow_mut().push((eventfd.as_raw_fd(), count));
        }
    }

    fn eventfd() -> OwnedFd {
        // SAFETY: a fresh eventfd, owned from here on.
        unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)) }
    }

    fn count(eventfd: &OwnedFd) -> u64 {
        let mut count = 0u64;
        // SAFETY: an 8-byte read into a live u64.
        let got = unsafe { libc::read(eventfd.as_raw_fd(), (&raw mut count).cast(), 8) };
        if got == 8 {
            count
        } else {
            0
        }
    }

    #[test]
    fn a_revoked_placement_signals_exactly_the_live_processes_noted_on_it() {
        use crate::xemem_board::tests::{board, note};
        let (board, _dir) = board("keeper-revoked");
        note(&board, 0, 100, 7, 0x20_0000, 0x1000);
        note(&board, 1, 100, 7, 0x40_0000, 0x1000);
        note(&board, 2, 200, 8, 0x40_0000, 0x1000);
        // Process 300 ended (its slot names a start time no live process has).
        note(&board, 3, 300, 9, 0x40_0000, 0x1000);
        let registry = Registry::new(Some(board));
        let delivered = Delivered { alive: vec![(100, 7), (200, 8), (300, 10)], ..Delivered::default() };
        assert_eq!(registry.deliver(GuestEvent::Revoked { window_offset: 0x20_0000 }, &delivered), 1);
        assert_eq!(*delivered.sigbus.borrow(), [100]);
        assert_eq!(registry.deliver(GuestEvent::Revoked { window_offset: 0x60_0000 }, &delivered), 0, "nothing placed there");
        delivered.sigbus.borrow_mut().clear();
        assert_eq!(registry.deliver(GuestEvent::Revoked { window_offset: 0x40_0000 }, &delivered), 2);
        assert_eq!(*delivered.sigbus.borrow(), [100, 200]);
        // Once per attachment: later reports of the same placement signal nobody again, but a
        // new attachment in a slot (a new generation) is signalled.
        assert_eq!(registry.deliver(GuestEvent::Revoked { window_offset: 0x40_0000 }, &delivered), 0, "signalled already");
        let board = registry.board.as_ref().unwrap();
        board.free(board.attachers(0x40_0000)[0]);
        note(board, 1, 100, 7, 0x40_0000, 0x1000);
        delivered.sigbus.borrow_mut().clear();
        assert_eq!(registry.deliver(GuestEvent::Revoked { window_offset: 0x40_0000 }, &delivered), 1, "attached again");
        assert_eq!(*delivered.sigbus.borrow(), [100]);
        // The ended process's slot was freed on the way.
        assert_eq!(board.attachers(0x40_0000).iter().map(|noted| noted.pid).collect::<Vec<_>>(), [100, 200]);
        // Without a board nobody is signalled, and nothing breaks.
        assert_eq!(Registry::new(None).deliver(GuestEvent::Revoked { window_offset: 0x40_0000 }, &delivered), 0);
    }

    #[test]
    fn the_system_signals_a_process_only_while_its_pid_has_the_start_time_noted() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let start = xemem_board::start_time(pid).unwrap();
        assert!(!System.sigbus(pid, start + 1), "a pid taken over by another process");
        assert!(child.try_wait().unwrap().is_none(), "not signalled");
        assert!(System.sigbus(pid, start));
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGBUS));
        assert!(!System.sigbus(pid, start), "gone");
    }

    #[test]
    fn signals_reach_the_owners_eventfd_and_are_counted_until_it_comes() {
        let registry = Arc::new(Registry::default());
        let mut owner = Connection::new(1, registry.clone());
        owner.apply(KEEP, 1, 0, vec![pipe()]).unwrap();
        owner.apply(MADE, 1, 0x500, vec![]).unwrap();
        // Two signals before the owner asked for its descriptor: counted, then written at once.
        assert_eq!(registry.deliver(GuestEvent::Signal { segid: 0x500 }, &System), 0);
        assert_eq!(registry.deliver(GuestEvent::Signal { segid: 0x500 }, &System), 0);
        let eventfd = eventfd();
        let ours = eventfd.try_clone().unwrap();
        assert!(owner.apply(NOTIFY, 1, 0x600, vec![eventfd.try_clone().unwrap()]).is_err(), "another segment's id");
        owner.apply(NOTIFY, 1, 0x500, vec![eventfd]).unwrap();
        assert_eq!(count(&ours), 2);
        assert_eq!(registry.deliver(GuestEvent::Signal { segid: 0x500 }, &System), 1);
        assert_eq!(count(&ours), 1);
        assert_eq!(registry.deliver(GuestEvent::Signal { segid: 0x700 }, &System), 0, "not a guest export");
        // Another process cannot claim the segment (nor, refused, drop it).
        let mut other = Connection::new(2, registry.clone());
        other.apply(KEEP, 1, 0, vec![]).unwrap();
        assert!(other.apply(MADE, 1, 0x500, vec![]).is_err(), "made by another process");
        other.apply(DROP, 1, 0, vec![]).unwrap();
        assert_eq!(registry.deliver(GuestEvent::Signal { segid: 0x500 }, &System), 1, "still the owner's");
        assert_eq!(count(&ours), 1);
        // Removed by its process: no more signals.
        owner.apply(DROP, 1, 0, vec![]).unwrap();
        let delivered = Delivered::default();
        assert_eq!(registry.deliver(GuestEvent::Signal { segid: 0x500 }, &delivered), 0);
        assert!(delivered.notified.borrow().is_empty());
    }

    #[test]
    fn stale_ops_and_notify_garbage_are_refused() {
        let mut connection = new_connection();
        // Ops 4 and 5 (attachments, now on the board) are unknown.
        assert!(connection.apply(4, 0x20_0000, 0x1000, vec![]).is_err(), "op 4");
        assert!(connection.apply(5, 0x20_0000, 0, vec![]).is_err(), "op 5");
        connection.apply(KEEP, 1, 0, vec![]).unwrap();
        assert!(connection.apply(NOTIFY, 1, 0x500, vec![eventfd()]).is_err(), "before the make");
        connection.apply(MADE, 1, 0x500, vec![]).unwrap();
        assert!(connection.apply(NOTIFY, 1, 0x500, vec![]).is_err(), "no descriptor");
        assert!(connection.apply(NOTIFY, 1, 0x500, vec![eventfd(), eventfd()]).is_err(), "two descriptors");
    }

    fn pipe() -> OwnedFd {
        let mut ends = [0; 2];
        // SAFETY: pipe2 into a two-element array.
        assert_eq!(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the write end is fresh and unused.
        unsafe { libc::close(ends[1]) };
        // SAFETY: the read end is fresh and owned from here on.
        unsafe { OwnedFd::from_raw_fd(ends[0]) }
    }

    #[test]
    fn an_ended_process_loses_what_it_still_exported_and_keeps_nothing_else() {
        let mut connection = new_connection();
        connection.apply(KEEP, 1, 0, vec![pipe(), pipe()]).unwrap();
        connection.apply(KEEP, 1, 0, vec![pipe()]).unwrap();
        connection.apply(MADE, 1, 0x500, vec![]).unwrap();
        connection.apply(KEEP, 2, 0, vec![pipe()]).unwrap();
        connection.apply(MADE, 2, 0x600, vec![]).unwrap();
        connection.apply(DROP, 2, 0, vec![]).unwrap();
        let recorder = Recorder::default();
        assert!(connection.end(&recorder).is_empty());
        assert_eq!(*recorder.removed.borrow(), [0x500]);
    }

    #[test]
    fn pages_stay_held_when_the_segment_cannot_be_removed_or_was_never_named() {
        let mut connection = new_connection();
        connection.apply(KEEP, 1, 0, vec![pipe()]).unwrap();
        connection.apply(MADE, 1, 0x500, vec![]).unwrap();
        let recorder = Recorder { answer: Some(libc::ETIMEDOUT), ..Recorder::default() };
        assert_eq!(connection.end(&recorder).len(), 1);
        let mut connection = new_connection();
        connection.apply(KEEP, 1, 0, vec![pipe(), pipe()]).unwrap();
        assert_eq!(connection.end(&Recorder::default()).len(), 2, "killed between KEEP and MADE");
        // Already gone: nothing to keep.
        let mut connection = new_connection();
        connection.apply(KEEP, 1, 0, vec![pipe()]).unwrap();
        connection.apply(MADE, 1, 0x500, vec![]).unwrap();
        assert!(connection.end(&Recorder { answer: Some(libc::ENOENT), ..Recorder::default() }).is_empty());
    }

    #[test]
    fn garbage_is_refused() {
        let mut connection = new_connection();
        assert!(connection.apply(MADE, 9, 0x500, vec![]).is_err(), "unknown export");
        assert!(connection.apply(DROP, 9, 0, vec![]).is_err(), "unknown export");
        assert!(connection.apply(7, 1, 0, vec![]).is_err(), "unknown op");
        connection.apply(KEEP, 1, 0, vec![]).unwrap();
        assert!(connection.apply(MADE, 1, 0, vec![pipe()]).is_err(), "descriptors with MADE");
        assert!(connection.apply(MADE, 1, -5, vec![]).is_err(), "not a segment id");
        connection.apply(MADE, 1, 0x500, vec![]).unwrap();
        assert!(connection.apply(MADE, 1, 0x600, vec![]).is_err(), "named twice");
        assert!(connection.apply(KEEP, 1, 0, vec![pipe()]).is_err(), "pages after the make");
        for tag in 2..=MAX_EXPORTS as u64 {
            connection.apply(KEEP, tag, 0, vec![]).unwrap();
        }
        assert!(connection.apply(KEEP, 0, 0, vec![]).is_err(), "one export too many");
    }
}
