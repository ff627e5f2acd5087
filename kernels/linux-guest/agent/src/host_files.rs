//! The job owner's host files inside the Linux enclave: a FUSE file system (the `fuser` crate
//! over `/dev/fuse`, mounted by the agent itself: the initramfs has no `fusermount`) whose
//! every lookup, attribute, open, read, directory listing, create, write, truncation, unlink,
//! mkdir, rmdir and rename is forwarded over the enclave channel as the LWK's `FileRequest`s. The daemon serves them exactly as an
//! LWK job's file calls (node/clowderd/src/hio.rs): as the job's user, within its `--confine`
//! directory, with the host's errnos; the guest is trusted with nothing.
//!
//! Each job gets its own mount (`<job dir>/root`), so nothing one user's job cached in the
//! guest kernel is seen by the next job's user, and runs chrooted in it with the guest's own
//! `/proc`, `/sys`, `/dev` and `/run` bound over the host's. Data comes back through
//! the file window, guest RAM the kernel was told to leave alone (`memmap=`), which the daemon
//! writes and the session copies out in user mode.
//!
//! Symbolic links are followed by the host (its `Stat` and `Open` follow them), so they
//! appear as what they lead to: `/bin` is a directory here, `python3` a file. Entries and
//! attributes are cached by the guest kernel for the job's life ([`TTL`]), misses too: each
//! round trip costs milliseconds of emulated guest kernel work and host polling.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use enclave_proto::FileAttributes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, Request, SessionACL,
};

use crate::session::Waking;

/// How long the guest kernel may trust an entry, an attribute or a miss: the whole job,
/// in practice (a file the host changes meanwhile may be seen stale).
const TTL: Duration = Duration::from_secs(3600);
/// Most entries one directory listing holds.
const MAX_ENTRIES: usize = 1 << 16;
/// The guest's own file systems, bound over the host's in the job's root (not `/tmp`: a job's
/// working directory may be there on the host).
const GUEST_MOUNTS: [&str; 4] = ["/proc", "/sys", "/dev", "/run"];

/// One file call, as the FUSE thread hands it to the session (which owns the channel and
/// knows where the file window is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileCall {
    Stat {
        path: Vec<u8>,
    },
    /// `flags` are Linux's `O_*` (a write, a create, a truncation included), `mode` a new
    /// file's.
    Open {
        path: Vec<u8>,
        flags: u32,
        mode: u32,
    },
    /// Read `len` bytes (at most the window's size) at `offset`.
    Pread {
        handle: u32,
        len: u32,
        offset: u64,
    },
    /// Write `data` (at most the window's size) at `offset`.
    Pwrite {
        handle: u32,
        offset: u64,
        data: Vec<u8>,
    },
    /// The next entries of a directory, `linux_dirent64` records.
    Getdents {
        handle: u32,
    },
    Ftruncate {
        handle: u32,
        length: u64,
    },
    Unlink {
        path: Vec<u8>,
    },
    Mkdir {
        path: Vec<u8>,
        mode: u32,
    },
    Rmdir {
        path: Vec<u8>,
    },
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Close {
        handle: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileAnswer {
    Value(u32),
    Attributes(FileAttributes),
    Data(Vec<u8>),
    Error(i32),
}

/// A call and where its answer goes.
pub struct Forwarded {
    pub job: u32,
    pub call: FileCall,
    pub answer: Sender<FileAnswer>,
}

/// The file window's size and the way to the session: what a job needs to mount.
#[derive(Clone)]
pub struct Forwarder {
    pub window: u32,
    pub calls: Waking<Forwarded>,
}

impl Forwarder {
    /// Forwards `call` and waits for its answer for as long as the session holds it: EIO only
    /// when the session drops it (the channel broke, the machine stops). No time limit: on a
    /// loaded PVM host the guest itself starves for minutes (a job's mount took 265 s, the
    /// session loop was away 98 s at load 11), and the 60 s limit there turned reads the
    /// host still served into EIO mid-`execve` or mid-import. A job waiting here can still be
    /// killed (FUSE waits are killable).
    pub(crate) fn call(&self, job: u32, call: FileCall) -> FileAnswer {
        let (answer, answered) = mpsc::channel();
        if self.calls.send(Forwarded { job, call, answer }).is_err() {
            return FileAnswer::Error(libc::EIO);
        }
        answered.recv().unwrap_or(FileAnswer::Error(libc::EIO))
    }
}

fn errno(code: i32) -> Errno {
    Errno::from_i32(code)
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn time(seconds: i64, nanoseconds: u32) -> SystemTime {
    match u64::try_from(seconds) {
        Ok(seconds) => UNIX_EPOCH + Duration::new(seconds, nanoseconds.min(999_999_999)),
        Err(_) => UNIX_EPOCH,
    }
}

/// The host's attributes as the guest kernel should see them, under FUSE node `node`.
pub fn file_attr(node: u64, host: &FileAttributes) -> FileAttr {
    FileAttr {
        ino: INodeNo(node),
        size: host.size,
        blocks: host.blocks,
        atime: time(host.accessed.seconds, host.accessed.nanoseconds),
        mtime: time(host.modified.seconds, host.modified.nanoseconds),
        ctime: time(host.changed.seconds, host.changed.nanoseconds),
        crtime: UNIX_EPOCH,
        kind: kind_of(host.mode),
        perm: (host.mode & 0o7777) as u16,
        nlink: u32::try_from(host.links).unwrap_or(u32::MAX),
        uid: host.uid,
        gid: host.gid,
        rdev: 0,
        blksize: host.block_size.clamp(512, 1 << 20),
        flags: 0,
    }
}

/// One directory entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub inode: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

/// The entries of `linux_dirent64` records as the host's `getdents64` wrote them; `None` when
/// a record does not fit the buffer or has no name.
pub fn parse_dirents(mut data: &[u8]) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    while !data.is_empty() {
        // d_ino (8), d_off (8), d_reclen (2), d_type (1), then the NUL-terminated name.
        let header = data.get(..19)?;
        let inode = u64::from_le_bytes(header[..8].try_into().ok()?);
        let length = u16::from_le_bytes([header[16], header[17]]) as usize;
        let record = data.get(..length).filter(|_| length > 19)?;
        let name = &record[19..];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if name.is_empty() {
            return None;
        }
        let kind = match header[18] {
            4 => FileType::Directory,
            10 => FileType::Symlink,
            2 => FileType::CharDevice,
            6 => FileType::BlockDevice,
            1 => FileType::NamedPipe,
            12 => FileType::Socket,
            _ => FileType::RegularFile,
        };
        entries.push(Entry { inode, kind, name: name.to_vec() });
        data = &data[length..];
    }
    Some(entries)
}

/// Host paths by FUSE node and back; node 1 is `/`.
struct Nodes {
    paths: Vec<Vec<u8>>,
    known: HashMap<Vec<u8>, u64>,
}

impl Nodes {
    fn new() -> Nodes {
        Nodes { paths: vec![Vec::new(), b"/".to_vec()], known: HashMap::from([(b"/".to_vec(), 1)]) }
    }

    fn path(&self, node: u64) -> Option<Vec<u8>> {
        self.paths.get(usize::try_from(node).ok()?).filter(|_| node != 0).cloned()
    }

    fn node(&mut self, path: Vec<u8>) -> u64 {
        if let Some(&node) = self.known.get(&path) {
            return node;
        }
        let node = self.paths.len() as u64;
        self.paths.push(path.clone());
        self.known.insert(path, node);
        node
    }
}

/// `parent`'s path joined with `name`.
fn child(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = parent.to_vec();
    if !path.ends_with(b"/") {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The FUSE file system of one job.
pub struct HostTree {
    job: u32,
    forwarder: Forwarder,
    nodes: Mutex<Nodes>,
    /// Open directories: their entries, read whole at opendir (the host's handle cannot seek).
    listings: Mutex<HashMap<u64, Vec<Entry>>>,
    next_listing: Mutex<u64>,
}

impl HostTree {
    pub fn new(job: u32, forwarder: Forwarder) -> HostTree {
        HostTree { job, forwarder, nodes: Mutex::new(Nodes::new()), listings: Mutex::new(HashMap::new()), next_listing: Mutex::new(1) }
    }

    fn call(&self, call: FileCall) -> FileAnswer {
        let started = std::time::Instant::now();
        let shown = format!("{call:?}");
        let answer = self.forwarder.call(self.job, call);
        if started.elapsed() > Duration::from_secs(2) {
            eprintln!("clowder-agent: job {}: {shown} took {} ms", self.job, started.elapsed().as_millis());
        }
        answer
    }

    fn path(&self, node: INodeNo) -> Result<Vec<u8>, Errno> {
        self.nodes.lock().unwrap().path(node.0).ok_or(Errno::ENOENT)
    }

    fn stat(&self, path: Vec<u8>) -> Result<FileAttributes, Errno> {
        match self.call(FileCall::Stat { path }) {
            FileAnswer::Attributes(attributes) => Ok(attributes),
            FileAnswer::Error(code) => Err(errno(code)),
            _ => Err(Errno::EIO),
        }
    }

    fn open(&self, path: Vec<u8>, flags: i32, mode: u32) -> Result<u32, Errno> {
        match self.call(FileCall::Open { path, flags: flags as u32, mode }) {
            FileAnswer::Value(handle) => Ok(handle),
            FileAnswer::Error(code) => Err(errno(code)),
            _ => Err(Errno::EIO),
        }
    }

    /// A call whose answer is a plain value (0 or a count).
    fn value(&self, call: FileCall) -> Result<u32, Errno> {
        match self.call(call) {
            FileAnswer::Value(value) => Ok(value),
            FileAnswer::Error(code) => Err(errno(code)),
            _ => Err(Errno::EIO),
        }
    }

    /// The entry of `path` after a call made it: its node and attributes.
    fn made(&self, path: Vec<u8>) -> Result<FileAttr, Errno> {
        let attributes = self.stat(path.clone())?;
        let node = self.nodes.lock().unwrap().node(path);
        Ok(file_attr(node, &attributes))
    }

    fn list(&self, handle: u32) -> Result<Vec<Entry>, Errno> {
        let mut entries = Vec::new();
        loop {
            match self.call(FileCall::Getdents { handle }) {
                FileAnswer::Data(data) if data.is_empty() => return Ok(entries),
                FileAnswer::Data(data) => entries.extend(parse_dirents(&data).ok_or(Errno::EIO)?),
                FileAnswer::Error(code) => return Err(errno(code)),
                _ => return Err(Errno::EIO),
            }
            if entries.len() > MAX_ENTRIES {
                return Err(Errno::EFBIG);
            }
        }
    }
}

/// The parts of open(2)'s flags the host acts on: access, creation, truncation, appending.
fn host_flags(flags: i32) -> i32 {
    flags & (libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND | libc::O_DIRECTORY | libc::O_NOFOLLOW)
}

impl Filesystem for HostTree {
    /// Writes come in pieces the file window holds.
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(self.forwarder.window);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.path(parent) {
            Ok(parent) => child(&parent, name.as_bytes()),
            Err(e) => return reply.error(e),
        };
        match self.stat(path.clone()) {
            Ok(attributes) => {
                let node = self.nodes.lock().unwrap().node(path);
                reply.entry(&TTL, &file_attr(node, &attributes), Generation(0));
            }
            // A miss is cached too (node 0): a program's start probes many paths that are not there.
            Err(e) if e == Errno::ENOENT => reply.entry(&TTL, &file_attr(0, &FileAttributes::default()), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, node: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(node).and_then(|path| self.stat(path)) {
            Ok(attributes) => reply.attr(&TTL, &file_attr(node.0, &attributes)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, node: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let reading = flags.0 & libc::O_ACCMODE == libc::O_RDONLY;
        match self.path(node).and_then(|path| self.open(path, host_flags(flags.0), 0)) {
            // The mount is the job's own, so a file it only reads may keep its cached pages; one
            // opened for writing starts afresh (the kernel writes through to the host).
            Ok(handle) => reply.opened(FileHandle(handle as u64), if reading { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() }),
            Err(e) => reply.error(e),
        }
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: fuser::ReplyCreate) {
        let path = match self.path(parent) {
            Ok(parent) => child(&parent, name.as_bytes()),
            Err(e) => return reply.error(e),
        };
        let handle = match self.open(path.clone(), host_flags(flags) | libc::O_CREAT, mode & !umask & 0o7777) {
            Ok(handle) => handle,
            Err(e) => return reply.error(e),
        };
        match self.made(path) {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(handle as u64), FopenFlags::empty()),
            Err(e) => {
                self.call(FileCall::Close { handle });
                reply.error(e)
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        _node: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        // The kernel sends no more than `init` allowed; a larger piece is refused, not cut.
        let (Ok(handle), true) = (u32::try_from(fh.0), data.len() <= self.forwarder.window as usize) else {
            return reply.error(Errno::EINVAL);
        };
        match self.value(FileCall::Pwrite { handle, offset, data: data.to_vec() }) {
            Ok(written) if written as usize <= data.len() => reply.written(written),
            Ok(_) => reply.error(Errno::EIO),
            Err(e) => reply.error(e),
        }
    }

    /// A size change (truncate, O_TRUNC) is the host's; times are left as the host keeps them
    /// (what `touch` asks is not an error), and mode or owner changes are not forwarded.
    fn setattr(
        &self,
        _req: &Request,
        node: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let path = match self.path(node) {
            Ok(path) => path,
            Err(e) => return reply.error(e),
        };
        if let Some(length) = size {
            let given = fh.and_then(|fh| u32::try_from(fh.0).ok());
            let truncated = match given {
                Some(handle) => self.value(FileCall::Ftruncate { handle, length }).map(drop),
                None => self.open(path.clone(), libc::O_WRONLY, 0).and_then(|handle| {
                    let done = self.value(FileCall::Ftruncate { handle, length }).map(drop);
                    self.call(FileCall::Close { handle });
                    done
                }),
            };
            if let Err(e) = truncated {
                return reply.error(e);
            }
        }
        match self.stat(path) {
            Ok(attributes) => reply.attr(&TTL, &file_attr(node.0, &attributes)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.path(parent).and_then(|parent| self.value(FileCall::Unlink { path: child(&parent, name.as_bytes()) })) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let path = match self.path(parent) {
            Ok(parent) => child(&parent, name.as_bytes()),
            Err(e) => return reply.error(e),
        };
        match self.value(FileCall::Mkdir { path: path.clone(), mode: mode & !umask & 0o7777 }).and_then(|_| self.made(path)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.path(parent).and_then(|parent| self.value(FileCall::Rmdir { path: child(&parent, name.as_bytes()) })) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// A plain rename (no RENAME_NOREPLACE or RENAME_EXCHANGE: the host's request has no flags).
    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let paths =
            self.path(parent).and_then(|from| Ok((child(&from, name.as_bytes()), child(&self.path(new_parent)?, new_name.as_bytes()))));
        match paths.and_then(|(from, to)| self.value(FileCall::Rename { from, to })) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Writes went to the host as they were made; the host's file system keeps them.
    fn flush(&self, _req: &Request, _node: INodeNo, _fh: FileHandle, _lock_owner: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _node: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        _node: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let (Ok(handle), len) = (u32::try_from(fh.0), size.min(self.forwarder.window)) else { return reply.error(Errno::EBADF) };
        // The session checked the host's count against `len`; checked again here, where the
        // bytes go to the guest kernel's page cache.
        match self.call(FileCall::Pread { handle, len, offset }) {
            FileAnswer::Data(data) if data.len() <= len as usize => reply.data(&data),
            FileAnswer::Error(code) => reply.error(errno(code)),
            _ => reply.error(Errno::EIO),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _node: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Ok(handle) = u32::try_from(fh.0) {
            self.call(FileCall::Close { handle });
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, node: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let handle = match self.path(node).and_then(|path| self.open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)) {
            Ok(handle) => handle,
            Err(e) => return reply.error(e),
        };
        let listed = self.list(handle);
        self.call(FileCall::Close { handle });
        match listed {
            Ok(entries) => {
                let mut next = self.next_listing.lock().unwrap();
                let listing = *next;
                *next += 1;
                self.listings.lock().unwrap().insert(listing, entries);
                reply.opened(FileHandle(listing), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _node: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listings = self.listings.lock().unwrap();
        let Some(entries) = listings.get(&fh.0) else { return reply.error(Errno::EBADF) };
        for (index, entry) in entries.iter().enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX)) {
            if reply.add(INodeNo(entry.inode.max(1)), index as u64 + 1, entry.kind, OsStr::from_bytes(&entry.name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _node: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.listings.lock().unwrap().remove(&fh.0);
        reply.ok();
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", path.display()))
}

fn mount(source: &str, target: &Path, kind: Option<&str>, flags: libc::c_ulong, data: Option<&str>) -> Result<(), String> {
    let (source_c, target_c) = (CString::new(source).expect("no NUL"), c_path(target)?);
    let kind_c = kind.map(|k| CString::new(k).expect("no NUL"));
    let data_c = data.map(|d| CString::new(d).expect("no NUL"));
    // SAFETY: mount(2) with NUL-terminated strings (or NULL) that outlive the call.
    let result = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            kind_c.as_ref().map_or(std::ptr::null(), |k| k.as_ptr()),
            flags,
            data_c.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    if result != 0 {
        return Err(format!("mounting {source} on {}: {}", target.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

fn unmount(target: &Path) {
    if let Ok(target) = c_path(target) {
        // SAFETY: umount2(2) with a NUL-terminated path; a lazy unmount never blocks.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A job's mounted host tree; unmounted (with the guest file systems bound into it) on drop,
/// which also ends its FUSE thread.
pub struct Mounted {
    pub root: PathBuf,
    binds: Vec<PathBuf>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for bind in self.binds.iter().rev() {
            unmount(bind);
        }
        unmount(&self.root);
    }
}

/// Mounts job `job`'s view of the host at `root` and serves it on a thread of its own. Called
/// off the session's thread: the mount's first lookups need the session to forward them.
pub fn mount_host_tree(job: u32, root: &Path, forwarder: Forwarder) -> Result<Mounted, String> {
    std::fs::create_dir_all(root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let device = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").map_err(|e| format!("opening /dev/fuse: {e}"))?;
    let fd: OwnedFd = device.into();
    let options = format!("fd={},rootmode=40000,user_id=0,group_id=0,allow_other,max_read={}", fd.as_raw_fd(), forwarder.window);
    mount("clowder-host", root, Some("fuse"), libc::MS_NOSUID | libc::MS_NODEV, Some(&options))?;
    let tree = HostTree::new(job, forwarder);
    std::thread::spawn(move || match fuser::Session::from_fd(tree, fd, SessionACL::All, fuser::Config::default()) {
        // Ends when the mount goes (the device then reads ENODEV).
        Ok(session) => {
            let _ = session.run();
        }
        Err(e) => eprintln!("clowder-agent: job {job}: the host files' FUSE session: {e}"),
    });
    let mut mounted = Mounted { root: root.to_path_buf(), binds: Vec::new() };
    for guest in GUEST_MOUNTS {
        let target = root.join(guest.trim_start_matches('/'));
        // A host without that directory just lacks it in the job's view.
        match mount(guest, &target, None, libc::MS_BIND, None) {
            Ok(()) => mounted.binds.push(target),
            Err(e) => eprintln!("clowder-agent: job {job}: {e}"),
        }
    }
    Ok(mounted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(inode: u64, kind: u8, name: &[u8]) -> Vec<u8> {
        let length = (19 + name.len() + 1).div_ceil(8) * 8;
        let mut bytes = vec![0u8; length];
        bytes[..8].copy_from_slice(&inode.to_le_bytes());
        bytes[16..18].copy_from_slice(&(length as u16).to_le_bytes());
        bytes[18] = kind;
        bytes[19..19 + name.len()].copy_from_slice(name);
        bytes
    }

    #[test]
    fn directory_records_are_parsed_and_bad_ones_refused() {
        let mut data = record(7, 4, b"usr");
        data.extend(record(9, 8, b"python3.11"));
        let entries = parse_dirents(&data).unwrap();
        assert_eq!(entries[0], Entry { inode: 7, kind: FileType::Directory, name: b"usr".to_vec() });
        assert_eq!(entries[1], Entry { inode: 9, kind: FileType::RegularFile, name: b"python3.11".to_vec() });
        assert_eq!(parse_dirents(&[]), Some(vec![]));
        assert_eq!(parse_dirents(&data[..30]), None, "a record past the end");
        let mut zero = record(1, 4, b"x");
        zero[16..18].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(parse_dirents(&zero), None, "a zero length would never end");
        assert_eq!(parse_dirents(&record(1, 4, b"")), None, "no name");
    }

    #[test]
    fn nodes_name_host_paths_and_unknown_ones_are_missing() {
        let mut nodes = Nodes::new();
        assert_eq!(nodes.path(1), Some(b"/".to_vec()));
        let usr = nodes.node(child(b"/", b"usr"));
        assert_eq!(nodes.node(b"/usr".to_vec()), usr, "one node per path");
        assert_eq!(nodes.path(usr), Some(b"/usr".to_vec()));
        assert_eq!(child(b"/usr", b"bin"), b"/usr/bin");
        assert_eq!(nodes.path(0), None);
        assert_eq!(nodes.path(99), None);
    }

    #[test]
    fn host_attributes_keep_mode_owner_and_times() {
        let host = FileAttributes {
            mode: libc::S_IFREG | 0o755,
            size: 10,
            uid: 1000,
            gid: 100,
            links: 1,
            modified: enclave_proto::Timestamp { seconds: 1_700_000_000, nanoseconds: 5 },
            ..FileAttributes::default()
        };
        let attr = file_attr(42, &host);
        assert_eq!(
            (attr.ino, attr.kind, attr.perm, attr.uid, attr.gid, attr.size),
            (INodeNo(42), FileType::RegularFile, 0o755, 1000, 100, 10)
        );
        assert_eq!(attr.mtime, UNIX_EPOCH + Duration::new(1_700_000_000, 5));
        assert_eq!(file_attr(1, &FileAttributes { mode: libc::S_IFDIR | 0o700, ..host }).kind, FileType::Directory);
        let before = FileAttributes { accessed: enclave_proto::Timestamp { seconds: -5, nanoseconds: 0 }, ..host };
        assert_eq!(file_attr(1, &before).atime, UNIX_EPOCH, "times before 1970 are clamped, not a panic");
    }
}
