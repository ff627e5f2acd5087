//! Forwarded file calls (Kitten's HIO): a job's `open`, `read`, `write`, ... arrive as
//! `FileRequest`s and are served here, confined to the job's working directory.
//!
//! Confinement has two layers: paths are checked by hand first, so a `..` that leaves the
//! directory or an absolute path elsewhere gets a clear refusal (EACCES) and a log line; then
//! every open goes through `openat2(RESOLVE_BENEATH)` on the directory's descriptor, so the
//! kernel also refuses symbolic links that lead out. Every call runs with the file-system
//! identity of the user who launched the job, so the daemon's root rights do not leak to it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};

use enclave_proto::{FileAttributes, FileOp, HostMessage, Timestamp};

use crate::guest_ram::GuestRam;
use crate::sys;

/// Open files one job may hold on the host.
pub const MAX_HANDLES: usize = 256;
/// Largest single read or write; the kernel splits bigger ones.
pub const MAX_TRANSFER: u32 = 16 << 20;

/// A job's view of its working directory on the host.
pub struct JobFiles {
    root: File,
    /// The directory's absolute host path, as the job sees it (its `cwd`).
    root_path: String,
    /// The (uid, gid) of the user who launched the job: file calls run with their rights.
    owner: (u32, u32),
    handles: HashMap<u32, File>,
    next_handle: u32,
}

/// What a request turned into: the reply, and a note for the enclave's log when a request was
/// refused for trying to leave the directory.
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

/// Turns a path the job gave into one relative to its directory, or says why not.
pub fn confine(root_path: &str, path: &[u8]) -> Result<String, String> {
    let path = std::str::from_utf8(path).map_err(|_| "path is not UTF-8".to_string())?;
    let relative = if let Some(absolute) = path.strip_prefix('/') {
        let root = root_path.trim_end_matches('/').trim_start_matches('/');
        match absolute.strip_prefix(root) {
            Some("") => "",
            Some(rest) if rest.starts_with('/') || root.is_empty() => rest.trim_start_matches('/'),
            _ => return Err(format!("absolute path {path:?} is outside the job's directory {root_path}")),
        }
    } else {
        path
    };
    let mut depth: usize = 0;
    let mut parts = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if depth == 0 {
                    return Err(format!("path {path:?} leaves the job's directory {root_path}"));
                }
                depth -= 1;
                parts.pop();
            }
            name => {
                depth += 1;
                parts.push(name);
            }
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

/// Splits `a/b/c` into (`a/b`, `c`); a bare name lives in `.`.
fn split_parent(relative: &str) -> (&str, &str) {
    match relative.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", relative),
    }
}

impl JobFiles {
    pub fn new(root: File, root_path: String, owner: (u32, u32)) -> JobFiles {
        JobFiles { root, root_path, owner, handles: HashMap::new(), next_handle: 1 }
    }

    /// Serves one request. `ram` is the enclave's memory, where read and write buffers live.
    pub fn serve(&mut self, op: &FileOp<'_>, ram: &GuestRam) -> Served {
        let mut refusal = None;
        let _identity = sys::FsIdentity::assume(self.owner.0, self.owner.1);
        let result = self.dispatch(op, ram, &mut refusal);
        Served { result, refusal }
    }

    fn path(&self, path: &[u8], refusal: &mut Option<String>) -> Result<String, i32> {
        confine(&self.root_path, path).map_err(|why| {
            *refusal = Some(why);
            libc::EACCES
        })
    }

    fn handle(&self, handle: u32) -> Result<&File, i32> {
        self.handles.get(&handle).ok_or(libc::EBADF)
    }

    fn transfer_buffer(ram: &GuestRam, gpa: u64, len: u32) -> Result<Vec<u8>, i32> {
        if len > MAX_TRANSFER {
            return Err(libc::EINVAL);
        }
        ram.check(gpa, len as u64).map_err(|_| libc::EFAULT)?;
        Ok(vec![0u8; len as usize])
    }

    fn dispatch(&mut self, op: &FileOp<'_>, ram: &GuestRam, refusal: &mut Option<String>) -> Result<Answer, i32> {
        let value = |v: usize| Ok(Answer::Value(v as i64));
        match *op {
            FileOp::Open { path, flags, mode } => {
                let relative = self.path(path, refusal)?;
                if self.handles.len() >= MAX_HANDLES {
                    return Err(libc::EMFILE);
                }
                // The job's O_CLOEXEC means nothing here; O_NOCTTY and friends are harmless.
                let file = sys::open_beneath(&self.root, &relative, flags as i32 & !libc::O_CLOEXEC, mode).map_err(|e| {
                    if e.raw_os_error() == Some(libc::EXDEV) {
                        *refusal = Some(format!("{relative:?} leads out of the job's directory (symbolic link)"));
                        libc::EACCES
                    } else {
                        errno_of(e)
                    }
                })?;
                let handle = self.next_handle;
                self.next_handle = self.next_handle.checked_add(1).ok_or(libc::EMFILE)?;
                self.handles.insert(handle, file);
                value(handle as usize)
            }
            FileOp::Close { handle } => self.handles.remove(&handle).map(|_| Answer::Value(0)).ok_or(libc::EBADF),
            FileOp::Read { handle, gpa, len } => {
                let mut buffer = Self::transfer_buffer(ram, gpa, len)?;
                let count = (&mut self.handle(handle)?).read(&mut buffer).map_err(errno_of)?;
                ram.write(gpa, &buffer[..count]).map_err(|_| libc::EFAULT)?;
                value(count)
            }
            FileOp::Pread { handle, gpa, len, offset } => {
                let mut buffer = Self::transfer_buffer(ram, gpa, len)?;
                let count = self.handle(handle)?.read_at(&mut buffer, offset).map_err(errno_of)?;
                ram.write(gpa, &buffer[..count]).map_err(|_| libc::EFAULT)?;
                value(count)
            }
            FileOp::Write { handle, gpa, len } => {
                let mut buffer = Self::transfer_buffer(ram, gpa, len)?;
                ram.read(gpa, &mut buffer).map_err(|_| libc::EFAULT)?;
                value((&mut self.handle(handle)?).write(&buffer).map_err(errno_of)?)
            }
            FileOp::Pwrite { handle, gpa, len, offset } => {
                let mut buffer = Self::transfer_buffer(ram, gpa, len)?;
                ram.read(gpa, &mut buffer).map_err(|_| libc::EFAULT)?;
                value(self.handle(handle)?.write_at(&buffer, offset).map_err(errno_of)?)
            }
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
                let relative = self.path(path, refusal)?;
                let file = sys::open_beneath(&self.root, &relative, libc::O_PATH, 0).map_err(errno_of)?;
                Ok(Answer::Attributes(attributes_of(&file.metadata().map_err(errno_of)?)))
            }
            FileOp::Unlink { path } | FileOp::Mkdir { path, .. } => {
                let relative = self.path(path, refusal)?;
                let (parent, name) = split_parent(&relative);
                if name == "." {
                    return Err(libc::EINVAL);
                }
                let directory = sys::open_beneath(&self.root, parent, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(errno_of)?;
                match *op {
                    FileOp::Mkdir { mode, .. } => sys::mkdir_in(&directory, name, mode),
                    _ => sys::unlink_in(&directory, name),
                }
                .map_err(errno_of)?;
                value(0)
            }
            FileOp::Ftruncate { handle, length } => {
                self.handle(handle)?.set_len(length).map_err(errno_of)?;
                value(0)
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
        assert_eq!(confine(root, b"out.txt").unwrap(), "out.txt");
        assert_eq!(confine(root, b"./a/../b//c").unwrap(), "b/c");
        assert_eq!(confine(root, b"/home/u/run/data/x").unwrap(), "data/x");
        assert_eq!(confine(root, b"/home/u/run").unwrap(), ".");
        assert!(confine(root, b"../secret").is_err());
        assert!(confine(root, b"a/../../secret").is_err());
        assert!(confine(root, b"/etc/passwd").is_err());
        assert!(confine(root, b"/home/u/runner/x").is_err(), "a sibling with the same prefix");
        assert!(confine(root, &[0xff]).is_err());
        assert_eq!(confine("/", b"/etc/hosts").unwrap(), "etc/hosts");
    }

    #[test]
    fn file_calls_run_with_the_launching_users_rights() {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            eprintln!("skipped: needs root to act as another user");
            return;
        }
        let dir = std::env::temp_dir().join(format!("clowder-hio-owner-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("theirs")).unwrap();
        std::fs::create_dir_all(dir.join("roots")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(dir.join("theirs"), Some(65534), Some(65534)).unwrap();
        let memfd = sys::memfd("hio-owner").unwrap();
        memfd.set_len(1 << 20).unwrap();
        let ram = GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: 1 << 20, file_offset: 0 }], (0, 0)).unwrap();
        let root = File::open(&dir).unwrap();
        let mut files = JobFiles::new(root, dir.to_str().unwrap().to_string(), (65534, 65534));
        let create = |path: &'static [u8]| FileOp::Open { path, flags: (libc::O_CREAT | libc::O_WRONLY) as u32, mode: 0o644 };
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
}
