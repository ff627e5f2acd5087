//! Forwarded file calls (Kitten's HIO): a job's `open`, `read`, `write`, ... arrive as
//! `FileRequest`s and are served here, as its user would see them on the host.
//!
//! Every call runs with the file-system identity of the user who launched the job (uid, gid
//! and supplementary groups, on the serving thread alone), so the daemon's root rights do not
//! leak to it: the host's own permission checks decide, and a job reaches exactly the files
//! its user could. Paths are the host's: absolute ones as they are, relative ones from the
//! job's working directory.
//!
//! A job may instead be confined to one directory ([`Scope::Confined`]). Confinement has two
//! layers: paths are checked by hand first, so a `..` that leaves the directory or an
//! absolute path elsewhere gets a clear refusal (EACCES) and a log line; then every open goes
//! through `openat2(RESOLVE_BENEATH)` on the directory's descriptor, so the kernel also
//! refuses symbolic links that lead out.
//!
//! Data moves straight between the file and the job's pages in enclave memory
//! ([`GuestRam::file_io`]): the enclave names guest-physical ranges, every one is checked
//! against the enclave's RAM first, and nothing is copied on the way.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;

use enclave_proto::{FileAttributes, FileOp, HostMessage, Timestamp};

use crate::guest_ram::GuestRam;
use crate::sys;

/// Open files one job may hold on the host.
pub const MAX_HANDLES: usize = 256;
/// Largest single read or write; the kernel splits bigger ones. It bounds how long one request
/// holds the enclave's pump (a few tenths of a second from the page cache).
pub const MAX_TRANSFER: u32 = 256 << 20;

/// Whose rights a job's file calls carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary one may be among them).
    pub groups: Vec<u32>,
}

/// Which of the host's files a job may name.
pub enum Scope {
    /// Any its user may open.
    User,
    /// Only those beneath the directory `path` (absolute, `dir` its descriptor), which holds
    /// the job's working directory.
    Confined { dir: File, path: String },
}

/// A job's view of the host's files.
pub struct JobFiles {
    /// The working directory: relative paths start here.
    cwd: File,
    /// Its absolute host path, as the job sees it (its `cwd`).
    cwd_path: String,
    scope: Scope,
    owner: Identity,
    handles: HashMap<u32, File>,
    next_handle: u32,
}

/// What a request turned into: the reply, and a note for the enclave's log when a request was
/// refused for trying to leave the directory it is confined to.
pub struct Served {
    pub result: Result<Answer, i32>,
    pub refusal: Option<String>,
}

pub enum Answer {
    Value(i64),
    Attributes(FileAttributes),
}

impl Served {
    /// The reply message for this request.
    pub fn reply(&self, job: u32, request: u32) -> HostMessage<'static> {
        match self.result {
            Ok(Answer::Value(result)) => HostMessage::FileResult { job, request, result },
            Ok(Answer::Attributes(attributes)) => HostMessage::FileAttributes { job, request, attributes },
            Err(errno) => HostMessage::FileResult { job, request, result: -(errno as i64) },
        }
    }
}

fn errno_of(error: std::io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

/// Writes the file system of `file` as Linux's `struct statfs` into enclave memory at `gpa`.
fn write_statfs(ram: &GuestRam, gpa: u64, file: &File) -> Result<Answer, i32> {
    ram.check(gpa, enclave_proto::STATFS_LEN as u64).map_err(|_| libc::EFAULT)?;
    let record = sys::statfs_record(file).map_err(errno_of)?;
    ram.write(gpa, &record).map_err(|_| libc::EFAULT)?;
    Ok(Answer::Value(0))
}

/// Whether `path` is one of `enclave_proto::SYSTEM_PATHS` or beneath one, absolute, with no
/// `.` or `..` component (so it cannot lead elsewhere by its spelling).
fn is_system_path(path: &[u8]) -> bool {
    let Ok(path) = std::str::from_utf8(path) else { return false };
    let plain = path.starts_with('/') && path.split('/').skip(1).all(|part| !matches!(part, "" | "." | ".."));
    plain
        && enclave_proto::SYSTEM_PATHS
            .iter()
            .any(|root| path.strip_prefix(root).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

/// Turns a path the job gave (relative to `cwd`, or absolute) into one relative to `root`,
/// or says why it lies outside. `cwd` is `root` or beneath it. Lexical only: symbolic links
/// are the kernel's to refuse (`sys::open_at` beneath the root).
pub fn confine(root: &str, cwd: &str, path: &[u8]) -> Result<String, String> {
    let path = std::str::from_utf8(path).map_err(|_| "path is not UTF-8".to_string())?;
    let root_trimmed = root.trim_end_matches('/').trim_start_matches('/');
    let within_root = |absolute: &str| -> Option<String> {
        let absolute = absolute.trim_start_matches('/');
        match absolute.strip_prefix(root_trimmed) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') || root_trimmed.is_empty() => Some(rest.to_string()),
            _ => None,
        }
    };
    let joined = if path.starts_with('/') {
        within_root(path).ok_or_else(|| format!("absolute path {path:?} is outside the job's directory {root}"))?
    } else {
        let cwd_part = within_root(cwd).ok_or_else(|| format!("the working directory {cwd} is outside {root}"))?;
        format!("{cwd_part}/{path}")
    };
    let mut parts = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!("path {path:?} leaves the job's directory {root}"));
                }
            }
            name => parts.push(name),
        }
    }
    Ok(if parts.is_empty() { ".".to_string() } else { parts.join("/") })
}

fn attributes_of(metadata: &std::fs::Metadata) -> FileAttributes {
    let time = |seconds: i64, nanoseconds: i64| Timestamp { seconds, nanoseconds: nanoseconds as u32 };
    FileAttributes {
        mode: metadata.mode(),
        size: metadata.size(),
        inode: metadata.ino(),
        links: metadata.nlink(),
        uid: metadata.uid(),
        gid: metadata.gid(),
        block_size: metadata.blksize() as u32,
        blocks: metadata.blocks(),
        accessed: time(metadata.atime(), metadata.atime_nsec()),
        modified: time(metadata.mtime(), metadata.mtime_nsec()),
        changed: time(metadata.ctime(), metadata.ctime_nsec()),
    }
}

/// `renameat(2)` of `from` in `from_dir` to `to` in `to_dir`.
fn rename_in(from_dir: &File, from: &str, to_dir: &File, to: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let c = |path: &str| std::ffi::CString::new(path).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: renameat(2) with open directory descriptors and NUL-terminated paths that outlive the call.
    match unsafe { libc::renameat(from_dir.as_raw_fd(), from.as_ptr(), to_dir.as_raw_fd(), to.as_ptr()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `unlinkat(2)` of the directory `path` in `dir` (`AT_REMOVEDIR`).
fn remove_directory_in(dir: &File, path: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let path = std::ffi::CString::new(path).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: unlinkat(2) with an open directory descriptor and a NUL-terminated path that outlives the call.
    match unsafe { libc::unlinkat(dir.as_raw_fd(), path.as_ptr(), libc::AT_REMOVEDIR) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Splits `a/b/c` into (`a/b`, `c`); a bare name lives in `.`.
fn split_parent(relative: &str) -> (&str, &str) {
    match relative.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", relative),
    }
}

impl Scope {
    /// The scope of a job confined to the directory `dir` (absolute), opened as `owner` would
    /// open it, and holding the working directory `cwd`; `within` is a confinement it must
    /// stay inside (the enclave's). The directory is kept by its real path, so a job's
    /// absolute paths are compared with what the host resolved.
    pub fn confined(dir: &str, cwd: &str, owner: &Identity, within: Option<&Scope>) -> Result<Scope, String> {
        use std::os::unix::fs::OpenOptionsExt;
        if !dir.starts_with('/') {
            return Err(format!("the confinement directory {dir:?} is not an absolute path"));
        }
        let opened = {
            let _identity = sys::FsIdentity::assume(owner.uid, owner.gid, &owner.groups)
                .map_err(|e| format!("cannot act as the job's user to open {dir}: {e}"))?;
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY).open(dir)
        };
        let file = opened.map_err(|e| format!("cannot open the confinement directory {dir}: {e}"))?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)))
            .map_err(|e| format!("cannot tell where {dir} is: {e}"))?;
        let real = real.to_str().ok_or_else(|| format!("the confinement directory {dir} has a path that is not UTF-8"))?.to_string();
        confine(&real, cwd, b".").map_err(|_| format!("the working directory {cwd} is outside the confinement directory {real}"))?;
        if let Some(Scope::Confined { path: outer, .. }) = within {
            confine(outer, &real, b".").map_err(|_| format!("the confinement directory {real} is outside the enclave's, {outer}"))?;
        }
        Ok(Scope::Confined { dir: file, path: real })
    }
}

/// Where a path lies for one call: a directory descriptor to start from, the path from it,
/// and whether the kernel must keep the lookup beneath that directory.
struct Target<'a> {
    dir: &'a File,
    path: String,
    beneath: bool,
}

impl JobFiles {
    pub fn new(cwd: File, cwd_path: String, scope: Scope, owner: Identity) -> JobFiles {
        JobFiles { cwd, cwd_path, scope, owner, handles: HashMap::new(), next_handle: 1 }
    }

    /// Serves one request. `ram` is the enclave's memory, where read and write buffers live.
    pub fn serve(&mut self, op: &FileOp<'_>, ram: &GuestRam) -> Served {
        let mut refusal = None;
        let result = match sys::FsIdentity::assume(self.owner.uid, self.owner.gid, &self.owner.groups) {
            Ok(_identity) => self.dispatch(op, ram, &mut refusal),
            Err(e) => {
                refusal = Some(format!("cannot take on the job owner's groups ({e}); serving nothing as the daemon"));
                Err(libc::EACCES)
            }
        };
        Served { result, refusal }
    }

    fn target(&self, path: &[u8], refusal: &mut Option<String>) -> Result<Target<'_>, i32> {
        match &self.scope {
            Scope::User => {
                let path = std::str::from_utf8(path).map_err(|_| libc::EINVAL)?;
                Ok(Target { dir: &self.cwd, path: path.to_string(), beneath: false })
            }
            Scope::Confined { .. } if is_system_path(path) => {
                Ok(Target { dir: &self.cwd, path: String::from_utf8_lossy(path).into_owned(), beneath: false })
            }
            Scope::Confined { dir, path: root } => match confine(root, &self.cwd_path, path) {
                Ok(relative) => Ok(Target { dir, path: relative, beneath: true }),
                Err(why) => {
                    *refusal = Some(why);
                    Err(libc::EACCES)
                }
            },
        }
    }

    /// Whether a target is one of the system paths a confined job may only read.
    fn read_only(&self, target: &Target<'_>) -> bool {
        matches!(self.scope, Scope::Confined { .. }) && !target.beneath
    }

    /// Opens a target; a symbolic link out of a confinement is a refusal like any other way out.
    fn open(target: &Target<'_>, flags: i32, mode: u32, refusal: &mut Option<String>) -> Result<File, i32> {
        sys::open_at(target.dir, &target.path, flags, mode, target.beneath).map_err(|e| {
            if target.beneath && e.raw_os_error() == Some(libc::EXDEV) {
                *refusal = Some(format!("{:?} leads out of the job's directory (symbolic link)", target.path));
                libc::EACCES
            } else {
                errno_of(e)
            }
        })
    }

    /// Where a call that makes, removes or renames the entry `path` acts: the directory (none:
    /// the working directory) and the entry's name in it. Confined, the parent is opened
    /// beneath the root, so the kernel refuses one that leads out; otherwise the host resolves
    /// the whole path as for the user. A system path is read-only.
    fn entry(&self, path: &[u8], refusal: &mut Option<String>) -> Result<(Option<File>, String), i32> {
        let target = self.target(path, refusal)?;
        if self.read_only(&target) {
            return Err(libc::EROFS);
        }
        if !target.beneath {
            return Ok((None, target.path));
        }
        let (parent, name) = split_parent(&target.path);
        if name == "." {
            return Err(libc::EINVAL);
        }
        let parent = Target { dir: target.dir, path: parent.to_string(), beneath: true };
        Ok((Some(Self::open(&parent, libc::O_PATH | libc::O_DIRECTORY, 0, refusal)?), name.to_string()))
    }

    /// The open file behind `handle` (`EBADF` if there is none).
    pub(crate) fn handle(&self, handle: u32) -> Result<&File, i32> {
        self.handles.get(&handle).ok_or(libc::EBADF)
    }

    /// A read or write of `len` bytes at guest-physical `gpa`, straight between the file and
    /// enclave memory; a range outside the enclave's RAM (or in the channel) is EFAULT.
    fn transfer(&self, ram: &GuestRam, handle: u32, gpa: u64, len: u32, into_guest: bool, offset: Option<u64>) -> Result<Answer, i32> {
        if len > MAX_TRANSFER {
            return Err(libc::EINVAL);
        }
        let file = self.handle(handle)?;
        let count = ram.file_io(file, gpa, len as u64, into_guest, offset).map_err(|_| libc::EFAULT)?.map_err(errno_of)?;
        Ok(Answer::Value(count as i64))
    }

    fn dispatch(&mut self, op: &FileOp<'_>, ram: &GuestRam, refusal: &mut Option<String>) -> Result<Answer, i32> {
        match *op {
            FileOp::Open { path, flags, mode } => {
                if self.handles.len() >= MAX_HANDLES {
                    return Err(libc::EMFILE);
                }
                let target = self.target(path, refusal)?;
                let changes = flags as i32 & libc::O_ACCMODE != libc::O_RDONLY || flags as i32 & (libc::O_CREAT | libc::O_TRUNC) != 0;
                if changes && self.read_only(&target) {
                    return Err(libc::EROFS);
                }
                // The job's O_CLOEXEC means nothing here; O_NOCTTY and friends are harmless.
                let file = Self::open(&target, flags as i32 & !libc::O_CLOEXEC, mode, refusal)?;
                let handle = self.next_handle;
                self.next_handle = self.next_handle.checked_add(1).ok_or(libc::EMFILE)?;
                self.handles.insert(handle, file);
                Ok(Answer::Value(handle as i64))
            }
            FileOp::Close { handle } => self.handles.remove(&handle).map(|_| Answer::Value(0)).ok_or(libc::EBADF),
            FileOp::Read { handle, gpa, len } => self.transfer(ram, handle, gpa, len, true, None),
            FileOp::Pread { handle, gpa, len, offset } => self.transfer(ram, handle, gpa, len, true, Some(offset)),
            FileOp::Write { handle, gpa, len } => self.transfer(ram, handle, gpa, len, false, None),
            FileOp::Pwrite { handle, gpa, len, offset } => self.transfer(ram, handle, gpa, len, false, Some(offset)),
            FileOp::Lseek { handle, offset, whence } => {
                let target = match whence {
                    0 => SeekFrom::Start(u64::try_from(offset).map_err(|_| libc::EINVAL)?),
                    1 => SeekFrom::Current(offset),
                    2 => SeekFrom::End(offset),
                    _ => return Err(libc::EINVAL),
                };
                let position = (&mut self.handle(handle)?).seek(target).map_err(errno_of)?;
                Ok(Answer::Value(position as i64))
            }
            FileOp::Fstat { handle } => Ok(Answer::Attributes(attributes_of(&self.handle(handle)?.metadata().map_err(errno_of)?))),
            FileOp::Stat { path } => {
                let file = Self::open(&self.target(path, refusal)?, libc::O_PATH, 0, refusal)?;
                Ok(Answer::Attributes(attributes_of(&file.metadata().map_err(errno_of)?)))
            }
            FileOp::Unlink { path } | FileOp::Mkdir { path, .. } | FileOp::Rmdir { path } => {
                let (parent, name) = self.entry(path, refusal)?;
                let dir = parent.as_ref().unwrap_or(&self.cwd);
                match *op {
                    FileOp::Mkdir { mode, .. } => sys::mkdir_in(dir, &name, mode),
                    FileOp::Rmdir { .. } => remove_directory_in(dir, &name),
                    _ => sys::unlink_in(dir, &name),
                }
                .map_err(errno_of)?;
                Ok(Answer::Value(0))
            }
            FileOp::Rename { from, to } => {
                let (from_parent, from_name) = self.entry(from, refusal)?;
                let (to_parent, to_name) = self.entry(to, refusal)?;
                let (from_dir, to_dir) = (from_parent.as_ref().unwrap_or(&self.cwd), to_parent.as_ref().unwrap_or(&self.cwd));
                rename_in(from_dir, &from_name, to_dir, &to_name).map_err(errno_of)?;
                Ok(Answer::Value(0))
            }
            FileOp::Ftruncate { handle, length } => {
                self.handle(handle)?.set_len(length).map_err(errno_of)?;
                Ok(Answer::Value(0))
            }
            FileOp::Statfs { path, gpa } => {
                let file = Self::open(&self.target(path, refusal)?, libc::O_PATH, 0, refusal)?;
                write_statfs(ram, gpa, &file)
            }
            FileOp::Fstatfs { handle, gpa } => write_statfs(ram, gpa, self.handle(handle)?),
            // Regions of the enclave's machine: its pump serves them (`enclave::shared_files`).
            FileOp::MapShared { .. } | FileOp::UnmapShared { .. } => Err(libc::ENOSYS),
            FileOp::Getdents { handle, gpa, len } => {
                if len > MAX_TRANSFER {
                    return Err(libc::EINVAL);
                }
                ram.check(gpa, len as u64).map_err(|_| libc::EFAULT)?;
                let entries = sys::read_directory(self.handle(handle)?, len as usize).map_err(errno_of)?;
                ram.write(gpa, &entries).map_err(|_| libc::EFAULT)?;
                Ok(Answer::Value(entries.len() as i64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_ram::RamRange;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn paths_are_confined_to_the_directory() {
        let root = "/home/u/run";
        let confine = |path: &[u8]| confine(root, root, path);
        assert_eq!(confine(b"out.txt").unwrap(), "out.txt");
        assert_eq!(confine(b"./a/../b//c").unwrap(), "b/c");
        assert_eq!(confine(b"/home/u/run/data/x").unwrap(), "data/x");
        assert_eq!(confine(b"/home/u/run").unwrap(), ".");
        assert!(confine(b"../secret").is_err());
        assert!(confine(b"a/../../secret").is_err());
        assert!(confine(b"/etc/passwd").is_err());
        assert!(confine(b"/home/u/runner/x").is_err(), "a sibling with the same prefix");
        assert!(confine(&[0xff]).is_err());
        assert_eq!(super::confine("/", "/", b"/etc/hosts").unwrap(), "etc/hosts");
    }

    #[test]
    fn relative_paths_start_from_a_working_directory_below_the_root() {
        let root = "/home/u/project";
        let cwd = "/home/u/project/run/1";
        assert_eq!(confine(root, cwd, b"out.txt").unwrap(), "run/1/out.txt");
        assert_eq!(confine(root, cwd, b"../../deck").unwrap(), "deck", "up, but not out");
        assert!(confine(root, cwd, b"../../../x").is_err());
        assert!(confine(root, "/elsewhere", b"x").is_err(), "a working directory outside the root");
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("clowder-hio-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn ram() -> GuestRam {
        let memfd = sys::memfd("hio-test").unwrap();
        memfd.set_len(1 << 20).unwrap();
        GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: 1 << 20, file_offset: 0 }], (0, 0)).unwrap()
    }

    fn nobody(groups: Vec<u32>) -> Identity {
        Identity { uid: 65534, gid: 65534, groups }
    }

    /// A scratch directory for a test that acts as another user, which needs root; `None` (the
    /// test skipped, as printed) otherwise.
    fn scratch_as_root(name: &str) -> Option<std::path::PathBuf> {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            eprintln!("skipped: needs root to act as another user");
            return None;
        }
        Some(scratch(name))
    }

    fn open(path: &[u8], flags: i32) -> FileOp<'_> {
        FileOp::Open { path, flags: flags as u32, mode: 0o644 }
    }

    #[test]
    fn file_calls_run_with_the_launching_users_rights() {
        let Some(dir) = scratch_as_root("owner") else { return };
        std::fs::create_dir_all(dir.join("theirs")).unwrap();
        std::fs::create_dir_all(dir.join("roots")).unwrap();
        std::os::unix::fs::chown(dir.join("theirs"), Some(65534), Some(65534)).unwrap();
        let ram = ram();
        let scope = Scope::Confined { dir: File::open(&dir).unwrap(), path: dir.to_str().unwrap().to_string() };
        let mut files = JobFiles::new(File::open(&dir).unwrap(), dir.to_str().unwrap().to_string(), scope, nobody(vec![]));
        let create = |path| open(path, libc::O_CREAT | libc::O_WRONLY);
        let served = files.serve(&create(b"theirs/out"), &ram);
        assert!(matches!(served.result, Ok(Answer::Value(handle)) if handle > 0));
        let metadata = std::fs::metadata(dir.join("theirs/out")).unwrap();
        assert_eq!((metadata.uid(), metadata.gid()), (65534, 65534), "created as the user");
        let served = files.serve(&create(b"roots/out"), &ram);
        assert!(matches!(served.result, Err(libc::EACCES)), "root's directory stays closed to the user");
        // The thread is root again afterwards.
        std::fs::write(dir.join("roots/by-root"), "x").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Unconfined, a job reaches what its user reaches anywhere on the host, by absolute path
    /// or relative to its working directory, and nothing more: not a root-only file, not a
    /// directory it may not write, unless a supplementary group of the user's opens it.
    #[test]
    fn unconfined_jobs_see_the_hosts_files_as_their_user() {
        let Some(dir) = scratch_as_root("user") else { return };
        let (cwd, elsewhere) = (dir.join("run"), dir.join("inputs"));
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::chown(&cwd, Some(65534), Some(65534)).unwrap();
        std::fs::write(elsewhere.join("deck"), "input deck").unwrap();
        std::fs::write(elsewhere.join("secret"), "root only").unwrap();
        std::fs::set_permissions(elsewhere.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(elsewhere.join("group-file"), "for group 4242").unwrap();
        std::os::unix::fs::chown(elsewhere.join("group-file"), Some(0), Some(4242)).unwrap();
        std::fs::set_permissions(elsewhere.join("group-file"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("deck"), cwd.join("link-to-deck")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("secret"), cwd.join("link-to-secret")).unwrap();
        let ram = ram();
        let cwd_path = cwd.to_str().unwrap().to_string();
        let mut files = JobFiles::new(File::open(&cwd).unwrap(), cwd_path.clone(), Scope::User, nobody(vec![]));
        let path = |name: &str| format!("{}/{name}", elsewhere.to_str().unwrap());
        let deck = path("deck");
        let served = files.serve(&open(deck.as_bytes(), libc::O_RDONLY), &ram);
        let Ok(Answer::Value(handle)) = served.result else { panic!("an input by absolute path outside the working directory") };
        let served = files.serve(&FileOp::Read { handle: handle as u32, gpa: 4096, len: 64 }, &ram);
        assert!(matches!(served.result, Ok(Answer::Value(10))));
        let mut back = [0u8; 10];
        ram.read(4096, &mut back).unwrap();
        assert_eq!(&back, b"input deck");
        let secret = path("secret");
        assert!(matches!(files.serve(&open(secret.as_bytes(), libc::O_RDONLY), &ram).result, Err(libc::EACCES)), "root-only file");
        assert!(
            matches!(files.serve(&FileOp::Stat { path: b"link-to-deck" }, &ram).result, Ok(Answer::Attributes(_))),
            "a link, as on the host"
        );
        assert!(
            matches!(files.serve(&open(b"link-to-secret", libc::O_RDONLY), &ram).result, Err(libc::EACCES)),
            "a link to a root-only file"
        );
        let forbidden = path("new");
        let served = files.serve(&open(forbidden.as_bytes(), libc::O_CREAT | libc::O_WRONLY), &ram);
        assert!(matches!(served.result, Err(libc::EACCES)), "a directory the user may not write");
        assert!(matches!(files.serve(&FileOp::Mkdir { path: forbidden.as_bytes(), mode: 0o755 }, &ram).result, Err(libc::EACCES)));
        assert!(files.serve(&open(b"mine", libc::O_CREAT | libc::O_WRONLY), &ram).result.is_ok(), "relative, in its own directory");
        assert!(cwd.join("mine").exists());
        assert!(files.serve(&FileOp::Unlink { path: b"mine" }, &ram).result.is_ok());
        let group_file = path("group-file");
        assert!(matches!(files.serve(&open(group_file.as_bytes(), libc::O_RDONLY), &ram).result, Err(libc::EACCES)));
        let mut member = JobFiles::new(File::open(&cwd).unwrap(), cwd_path, Scope::User, nobody(vec![4242]));
        assert!(member.serve(&open(group_file.as_bytes(), libc::O_RDONLY), &ram).result.is_ok(), "a supplementary group counts");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn confined_jobs_may_read_the_systems_libraries_and_nothing_else_outside() {
        let dir = scratch("system");
        let ram = ram();
        let scope = Scope::Confined { dir: File::open(&dir).unwrap(), path: dir.to_str().unwrap().to_string() };
        let root = Identity { uid: 0, gid: 0, groups: vec![] };
        let mut files = JobFiles::new(File::open(&dir).unwrap(), dir.to_str().unwrap().to_string(), scope, root);
        assert!(matches!(files.serve(&open(b"/etc/ld.so.cache", libc::O_RDONLY), &ram).result, Ok(_) | Err(libc::ENOENT)));
        assert!(matches!(files.serve(&FileOp::Stat { path: b"/usr/lib" }, &ram).result, Ok(Answer::Attributes(_))));
        assert!(matches!(files.serve(&open(b"/usr/lib/clowder-test", libc::O_CREAT | libc::O_WRONLY), &ram).result, Err(libc::EROFS)));
        assert!(matches!(files.serve(&FileOp::Unlink { path: b"/usr/lib/x" }, &ram).result, Err(libc::EROFS)));
        assert!(matches!(files.serve(&FileOp::Stat { path: b"/usr/lib/../../etc/passwd" }, &ram).result, Err(libc::EACCES)));
        assert!(matches!(files.serve(&FileOp::Stat { path: b"/usr/library" }, &ram).result, Err(libc::EACCES)));
        assert!(matches!(files.serve(&FileOp::Stat { path: b"/etc/passwd" }, &ram).result, Err(libc::EACCES)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A confined job renames and removes entries beneath its directory and nowhere else.
    #[test]
    fn renames_and_directory_removals_stay_in_the_confinement() {
        let dir = scratch("rename");
        let outside = scratch("rename-outside");
        let ram = ram();
        let scope = Scope::Confined { dir: File::open(&dir).unwrap(), path: dir.to_str().unwrap().to_string() };
        let root = Identity { uid: 0, gid: 0, groups: vec![] };
        let mut files = JobFiles::new(File::open(&dir).unwrap(), dir.to_str().unwrap().to_string(), scope, root);
        std::fs::write(dir.join("a"), "x").unwrap();
        assert!(files.serve(&FileOp::Mkdir { path: b"sub", mode: 0o755 }, &ram).result.is_ok());
        assert!(files.serve(&FileOp::Rename { from: b"a", to: b"sub/b" }, &ram).result.is_ok());
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "x");
        assert!(matches!(files.serve(&FileOp::Rmdir { path: b"sub" }, &ram).result, Err(libc::ENOTEMPTY)));
        let out = format!("{}/stolen", outside.to_str().unwrap());
        let served = files.serve(&FileOp::Rename { from: b"sub/b", to: out.as_bytes() }, &ram);
        assert!(matches!(served.result, Err(libc::EACCES)) && served.refusal.is_some(), "out of the directory");
        assert!(matches!(files.serve(&FileOp::Rename { from: b"sub/b", to: b"/usr/lib/b" }, &ram).result, Err(libc::EROFS)));
        assert!(files.serve(&FileOp::Unlink { path: b"sub/b" }, &ram).result.is_ok());
        assert!(files.serve(&FileOp::Rmdir { path: b"sub" }, &ram).result.is_ok());
        assert!(!dir.join("sub").exists() && !outside.join("stolen").exists());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    /// Reads and writes land in enclave memory directly; a range the enclave may not name is
    /// refused before the file is touched, and a read at the end of the file is short.
    #[test]
    fn data_moves_between_files_and_enclave_memory_checked() {
        let dir = scratch("data");
        let ram = ram();
        let mut files = JobFiles::new(
            File::open(&dir).unwrap(),
            dir.to_str().unwrap().to_string(),
            Scope::User,
            Identity { uid: 0, gid: 0, groups: vec![] },
        );
        let Ok(Answer::Value(handle)) = files.serve(&open(b"data", libc::O_CREAT | libc::O_RDWR), &ram).result else { panic!("create") };
        let handle = handle as u32;
        ram.write(8192, &[7u8; 12288]).unwrap();
        assert!(matches!(files.serve(&FileOp::Write { handle, gpa: 8192, len: 12288 }, &ram).result, Ok(Answer::Value(12288))));
        let served = files.serve(&FileOp::Pread { handle, gpa: 65536, len: 65536, offset: 4096 }, &ram);
        assert!(matches!(served.result, Ok(Answer::Value(8192))), "short at the end of the file");
        let outside = files.serve(&FileOp::Pread { handle, gpa: (1 << 20) - 4096, len: 8192, offset: 0 }, &ram);
        assert!(matches!(outside.result, Err(libc::EFAULT)), "crosses the end of RAM");
        let wrapping = files.serve(&FileOp::Pwrite { handle, gpa: u64::MAX - 10, len: 100, offset: 0 }, &ram);
        assert!(matches!(wrapping.result, Err(libc::EFAULT)));
        assert_eq!(std::fs::metadata(dir.join("data")).unwrap().len(), 12288, "a refused write wrote nothing");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// statfs and fstatfs write the host's `struct statfs` into enclave memory (tmpfs for
    /// /dev/shm, where MPI and UCX make their segments); bad paths, handles and ranges are
    /// refused.
    #[test]
    fn statfs_writes_the_hosts_answer_into_enclave_memory() {
        let dir = scratch("statfs");
        let ram = ram();
        let root = Identity { uid: 0, gid: 0, groups: vec![] };
        let mut files = JobFiles::new(File::open(&dir).unwrap(), dir.to_str().unwrap().to_string(), Scope::User, root);
        // Fields that stay while others use the file system: type, block size, blocks; id, name length.
        let stable = |record: &[u8]| [&record[..24], &record[56..72]].concat();
        let host = sys::statfs_record(File::open("/dev/shm").unwrap()).unwrap();
        assert_eq!(u64::from_le_bytes(host[..8].try_into().unwrap()), libc::TMPFS_MAGIC as u64);
        assert!(matches!(files.serve(&FileOp::Statfs { path: b"/dev/shm", gpa: 4096 }, &ram).result, Ok(Answer::Value(0))));
        let mut record = [0u8; enclave_proto::STATFS_LEN];
        ram.read(4096, &mut record).unwrap();
        assert_eq!(stable(&record), stable(&host));
        let Ok(Answer::Value(handle)) = files.serve(&open(b"/dev/shm", libc::O_RDONLY), &ram).result else { panic!("open /dev/shm") };
        let handle = handle as u32;
        assert!(matches!(files.serve(&FileOp::Fstatfs { handle, gpa: 8192 }, &ram).result, Ok(Answer::Value(0))));
        ram.read(8192, &mut record).unwrap();
        assert_eq!(stable(&record), stable(&host));
        assert!(matches!(files.serve(&FileOp::Statfs { path: b"missing", gpa: 4096 }, &ram).result, Err(libc::ENOENT)));
        assert!(matches!(files.serve(&FileOp::Fstatfs { handle: 999, gpa: 4096 }, &ram).result, Err(libc::EBADF)));
        let outside = files.serve(&FileOp::Statfs { path: b".", gpa: (1 << 20) - 100 }, &ram);
        assert!(matches!(outside.result, Err(libc::EFAULT)), "crosses the end of RAM");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
