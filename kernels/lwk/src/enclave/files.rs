//! The job's file calls on the host's files: a path that is not in the job's in-memory file
//! system and lies under its working directory (relative, or absolute under it) is opened on
//! the host with a `FileRequest`, and the descriptor names the host's handle from then on.
//! The calling thread waits for the answer. Data moves through a bounce buffer in kernel
//! memory whose guest-physical address goes in the request (the host reads or writes it
//! there): the job's own buffer may span physically separate pages (read-only image pages
//! are the executable's), and copying through the kernel turns bad pointers into EFAULT.

use super::rules::is_forwarded;
use super::{follow_up, with_state, FileAnswer};
use crate::arch::trap::{copy_from_user, copy_to_user};
use crate::arch::tables::{self, MAX_CPUS};
use crate::arch::phys;
use crate::job::{self, descriptors::Descriptor};
use crate::mm::pmem;
use alloc::string::String;
use core::sync::atomic::{AtomicU64, Ordering};
use enclave_proto::{EnclaveMessage, FileAttributes, FileOp};

/// Bytes one forwarded read or write moves at most (a longer write is several requests).
pub const BOUNCE_SIZE: u64 = 64 * 1024;
const EFAULT: i64 = 14;
const ENOMEM: i64 = 12;
const EMFILE: i64 = 24;

/// Each CPU's bounce buffer (physical address, 0 until first used). Per CPU and not locked:
/// a thread waiting for the host keeps its CPU (it halts, it does not yield), and a lock
/// would stay held if the host killed the job during the wait.
static BOUNCE: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// The running job's working directory on the host, if the kernel runs enclave jobs.
pub fn job_cwd() -> Option<String> {
    if !super::is_active() {
        return None;
    }
    with_state(|state| state.job.as_ref().map(|job| job.cwd.clone()))
}

/// Sends `op` for the running job and waits for the host's answer. Ends the job instead if
/// the host kills it meanwhile.
fn request(op: FileOp<'_>) -> FileAnswer {
    let request = with_state(|state| {
        let request = state.next_request;
        state.next_request = state.next_request.wrapping_add(1);
        let job = state.job.as_ref().map_or(0, |job| job.id);
        state.link.send(&EnclaveMessage::FileRequest { job, request, op });
        request
    });
    loop {
        let (followup, answer) = with_state(|state| (state.drain(), state.answers.remove(&request)));
        if let Some(answer) = answer {
            return answer;
        }
        follow_up(followup);
        super::wait_for_host_message();
    }
}

fn result_of(answer: FileAnswer) -> i64 {
    match answer {
        FileAnswer::Result(result) => result,
        // Attributes answer only Fstat/Stat; anywhere else the host broke the protocol.
        FileAnswer::Attributes(_) => -5, // EIO
    }
}

/// This CPU's bounce buffer.
fn bounce() -> Option<u64> {
    let slot = &BOUNCE[tables::current_cpu()];
    if slot.load(Ordering::Relaxed) == 0 {
        slot.store(pmem::allocate(BOUNCE_SIZE, 4096)?, Ordering::Relaxed);
    }
    Some(slot.load(Ordering::Relaxed))
}

/// Whether the running job's `path` (not in its in-memory file system) is the host's.
pub fn is_host_path(path: &str) -> bool {
    job_cwd().is_some_and(|cwd| is_forwarded(path, &cwd))
}

/// Opens a host path (`is_host_path`): the new descriptor, or a negated errno.
pub fn open(path: &str, flags: u32, mode: u32) -> i64 {
    let handle = result_of(request(FileOp::Open { path: path.as_bytes(), flags, mode }));
    if handle < 0 {
        return handle;
    }
    // What F_GETFL reports: the access mode and the status flags Linux keeps (O_APPEND,
    // O_NONBLOCK, O_DSYNC, O_DIRECT, O_NOATIME, O_SYNC's high bit), not the creation flags.
    const KEPT_FLAGS: u32 = 0o3 | 0o2000 | 0o4000 | 0o10000 | 0o40000 | 0o1000000 | 0o4000000;
    let status_flags = flags & KEPT_FLAGS;
    let descriptor = job::with_process(|process| process.descriptors.insert(Descriptor::Remote { handle: handle as u32, status_flags }));
    match descriptor {
        Some(descriptor) => descriptor as i64,
        None => {
            request(FileOp::Close { handle: handle as u32 });
            -EMFILE
        }
    }
}

/// `stat` of a host path, or a negated errno.
pub fn stat_path(path: &str) -> Result<FileAttributes, i64> {
    match request(FileOp::Stat { path: path.as_bytes() }) {
        FileAnswer::Attributes(attributes) => Ok(attributes),
        FileAnswer::Result(error) => Err(if error < 0 { error } else { -5 }),
    }
}

/// The host's handle behind `descriptor`, if it names a host file.
pub fn remote_handle(descriptor: u64) -> Option<u32> {
    if !super::is_active() {
        return None;
    }
    job::with_process(|process| match process.descriptors.get(descriptor).as_deref() {
        Some(Descriptor::Remote { handle, .. }) => Some(*handle),
        _ => None,
    })
}

pub fn close(handle: u32) -> i64 {
    result_of(request(FileOp::Close { handle }))
}

/// `read`, or `pread64` when `offset` is given: one request of at most `BOUNCE_SIZE` bytes.
pub fn read(handle: u32, buffer: u64, len: u64, offset: Option<u64>) -> i64 {
    let Some(bounce) = bounce() else { return -ENOMEM };
    let len = len.min(BOUNCE_SIZE) as u32;
    let gpa = bounce;
    let op = match offset {
        Some(offset) => FileOp::Pread { handle, gpa, len, offset },
        None => FileOp::Read { handle, gpa, len },
    };
    let count = result_of(request(op));
    if count > 0 && copy_to_user(buffer, phys::bytes(gpa, count.min(len as i64) as usize)).is_err() {
        return -EFAULT;
    }
    count
}

/// `write`: the whole buffer in requests of `BOUNCE_SIZE`, stopping at a short write.
pub fn write(handle: u32, buffer: u64, len: u64) -> i64 {
    let Some(bounce) = bounce() else { return -ENOMEM };
    let mut written = 0u64;
    while written < len {
        let chunk = (len - written).min(BOUNCE_SIZE);
        let staging = phys::bytes_mut(bounce, chunk as usize);
        if copy_from_user(staging, buffer + written).is_err() {
            return if written == 0 { -EFAULT } else { written as i64 };
        }
        let count = result_of(request(FileOp::Write { handle, gpa: bounce, len: chunk as u32 }));
        if count < 0 {
            return if written == 0 { count } else { written as i64 };
        }
        written += count as u64;
        if (count as u64) < chunk {
            break;
        }
    }
    written as i64
}

/// `pwrite64`: like `write`, at `offset` (the file's own offset stays).
pub fn write_at(handle: u32, buffer: u64, len: u64, offset: u64) -> i64 {
    let Some(bounce) = bounce() else { return -ENOMEM };
    let mut written = 0u64;
    while written < len {
        let chunk = (len - written).min(BOUNCE_SIZE);
        if copy_from_user(phys::bytes_mut(bounce, chunk as usize), buffer + written).is_err() {
            return if written == 0 { -EFAULT } else { written as i64 };
        }
        let op = FileOp::Pwrite { handle, gpa: bounce, len: chunk as u32, offset: offset + written };
        let count = result_of(request(op));
        if count < 0 {
            return if written == 0 { count } else { written as i64 };
        }
        written += count as u64;
        if (count as u64) < chunk {
            break;
        }
    }
    written as i64
}

pub fn truncate(handle: u32, length: u64) -> i64 {
    result_of(request(FileOp::Ftruncate { handle, length }))
}

pub fn unlink(path: &str) -> i64 {
    result_of(request(FileOp::Unlink { path: path.as_bytes() }))
}

pub fn make_directory(path: &str, mode: u32) -> i64 {
    result_of(request(FileOp::Mkdir { path: path.as_bytes(), mode }))
}

pub fn seek(handle: u32, offset: i64, whence: u32) -> i64 {
    result_of(request(FileOp::Lseek { handle, offset, whence }))
}

/// `fstat`: the host's attributes as a `struct stat`, or a negated errno.
pub fn attributes(handle: u32) -> Result<FileAttributes, i64> {
    match request(FileOp::Fstat { handle }) {
        FileAnswer::Attributes(attributes) => Ok(attributes),
        FileAnswer::Result(error) => Err(if error < 0 { error } else { -5 }),
    }
}

/// `struct stat` of x86-64 Linux as 18 words.
pub fn stat_words(attributes: &FileAttributes) -> [u64; 18] {
    let mut words = [0u64; 18];
    words[1] = attributes.inode;
    words[2] = attributes.links;
    words[3] = attributes.mode as u64 | (attributes.uid as u64) << 32;
    words[4] = attributes.gid as u64;
    words[6] = attributes.size;
    words[7] = attributes.block_size as u64;
    words[8] = attributes.blocks;
    for (index, time) in [attributes.accessed, attributes.modified, attributes.changed].iter().enumerate() {
        words[9 + 2 * index] = time.seconds as u64;
        words[10 + 2 * index] = time.nanoseconds as u64;
    }
    words
}

/// A forwarded call's result as a system call's: negative values are negated errnos.
pub fn to_syscall_result(value: i64) -> crate::syscall::SyscallResult {
    if value < 0 {
        Err(crate::syscall::Errno(value.unsigned_abs()))
    } else {
        Ok(value as u64)
    }
}
