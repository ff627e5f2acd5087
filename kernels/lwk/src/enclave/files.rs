//! The job's file calls on the host's files: a path that is not in the job's in-memory file
//! system (relative to its working directory, or absolute) is opened on the host with a
//! `FileRequest`, and the descriptor names the host's handle from then on. The host decides
//! what the job may reach: what its user may, or, confined, what lies beneath one directory.
//! The calling thread waits for the answer. Data moves without a copy in the enclave: the
//! request names the guest-physical run under the job's buffer (its memory is contiguous, so
//! a buffer is one run, or a few where it crosses mappings), and the host reads or writes the
//! job's pages there. A copy through kernel memory would be emulated on PVM: `rep movsb` in
//! ring 0 costs ~0.3 µs per byte, 20 ms per 64 KiB. Unmapped buffers are EFAULT, and a read
//! only lands in pages the job may write. Pages outside the enclave's RAM (the executable's
//! read-only pages mapped from the region the host shared, an XEMEM attachment), which the
//! host does not take as buffers, go through a per-CPU bounce buffer instead.

use super::{follow_up, with_state, FileAnswer};
use crate::arch::phys;
use crate::arch::tables::{self, MAX_CPUS};
use crate::arch::trap::{copy_from_user, copy_to_user, USER_END};
use crate::job::{self, descriptors::Descriptor};
use crate::linux::Errno;
use crate::mm::{self, pmem};
use alloc::string::String;
use core::sync::atomic::{AtomicU64, Ordering};
use enclave_proto::{EnclaveMessage, FileAttributes, FileOp, STATFS_LEN};

/// Bytes one forwarded request moves at most (a longer read or write is several requests):
/// bounds the host's work per message (it allows 256 MiB).
pub const MAX_TRANSFER: u64 = 64 << 20;
/// Bytes one request moves at most through the bounce buffer.
const BOUNCE_SIZE: u64 = 64 * 1024;
// The errnos answered here, as the host's answers carry them (negated i64s).
const EFAULT: i64 = Errno::EFAULT.0 as i64;
const ENOMEM: i64 = Errno::ENOMEM.0 as i64;
const EMFILE: i64 = Errno::EMFILE.0 as i64;
const EIO: i64 = Errno::EIO.0 as i64;

/// Each CPU's bounce buffer (physical address, 0 until first used). Per CPU and not locked:
/// a thread waiting for the host with data in it keeps its CPU (`request_here`), and a lock
/// would stay held if the host killed the job during the wait.
static BOUNCE: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// This CPU's bounce buffer.
pub(crate) fn bounce() -> Option<u64> {
    let slot = &BOUNCE[tables::current_cpu()];
    if slot.load(Ordering::Relaxed) == 0 {
        slot.store(pmem::allocate(BOUNCE_SIZE, 4096)?, Ordering::Relaxed);
    }
    Some(slot.load(Ordering::Relaxed))
}

/// The running job's working directory on the host, if the kernel runs enclave jobs.
pub fn job_cwd() -> Option<String> {
    if !super::is_active() {
        return None;
    }
    let job = crate::sched::current_job();
    with_state(|state| state.jobs.get(&job).map(|running| running.cwd.clone()))
}

/// Sends `op` for the running job and waits for the host's answer. Ends the job instead if
/// the host kills it meanwhile. The thread sleeps through the wait while others wait for its
/// CPU (`forward`).
fn request(op: FileOp<'_>) -> FileAnswer {
    forward(op, true)
}

/// As `request`, keeping this CPU through the wait: for requests whose data passes through
/// this CPU's bounce buffer, which another thread could reuse meanwhile.
fn request_here(op: FileOp<'_>) -> FileAnswer {
    forward(op, false)
}

/// The host's answers to file requests over the channel so far, and the key their waiters
/// sleep on (`answer_arrived`).
static ANSWERS_ARRIVED: AtomicU64 = AtomicU64::new(0);
static ANSWER_KEY: u8 = 0;

/// The channel brought a file answer (`State::drain`, which recorded it): its waiter, if
/// asleep, looks again.
pub(super) fn answer_arrived() {
    ANSWERS_ARRIVED.fetch_add(1, Ordering::SeqCst);
    crate::sched::wake_kernel_key_only(&ANSWER_KEY as *const u8 as u64);
}

/// Sends `op` and waits for its answer: through this CPU's file slot, keeping the CPU, while
/// no other thread waits for it (the host answers within microseconds when idle; one that
/// comes to wait meanwhile gets the CPU when `may_sleep`: `slots`); else, when `may_sleep`,
/// through the channel, asleep until the answer comes. With four MPI ranks in a
/// two-vCPU enclave on a loaded host an answer took 20 ms on average and up to seconds, and
/// threads waiting so kept both CPUs from the ranks' PMIx progress threads: stalls of over a
/// second, past PMIx's 2 s finalize timer.
fn forward(op: FileOp<'_>, may_sleep: bool) -> FileAnswer {
    let (job, request) = with_state(|state| {
        let request = state.next_request;
        state.next_request = state.next_request.wrapping_add(1);
        (crate::sched::current_job(), request)
    });
    // The process's next file calls on this CPU may come from ring 3.
    if !crate::arch::fastcall::files_ready_on(tables::current_cpu()) {
        super::slots::ring3_publish(job);
    }
    let sleeps = || may_sleep && crate::sched::others_wait_here();
    // This CPU's file slot when the host polls them; else the channel.
    if !sleeps() {
        if let Some(answer) = super::slots::call(job, request, &op, may_sleep) {
            return answer;
        }
    }
    with_state(|state| state.link.send(&EnclaveMessage::FileRequest { job, request, op }));
    loop {
        let seen = ANSWERS_ARRIVED.load(Ordering::SeqCst);
        let (followup, answer) = with_state(|state| (state.drain(), state.answers.remove(&request)));
        if let Some(answer) = answer {
            return answer;
        }
        follow_up(followup);
        if sleeps() {
            // A thread being killed stops waiting: beside other jobs the host may never answer.
            if crate::sched::current_thread_doomed() {
                return FileAnswer::Result(-EIO);
            }
            crate::sched::wait_for_host(&ANSWER_KEY as *const u8 as u64, None, || ANSWERS_ARRIVED.load(Ordering::SeqCst) == seen);
        } else {
            super::wait_for_host_message();
        }
    }
}

fn result_of(answer: FileAnswer) -> i64 {
    match answer {
        FileAnswer::Result(result) => result,
        // Attributes answer only Fstat/Stat; anywhere else the host broke the protocol.
        FileAnswer::Attributes(_) => -EIO,
    }
}

/// Where the start of a user buffer lies, for the host to read or write it.
pub(crate) enum Run {
    /// Guest-physical `[gpa, gpa + len)` in the enclave's RAM: the host uses it directly.
    Ram { gpa: u64, len: u64 },
    /// Mapped outside RAM: at most `len` bytes go through the bounce buffer.
    Elsewhere { len: u64 },
}

/// The run that holds the start of user buffer `[buffer, buffer + len)` (at most
/// `MAX_TRANSFER` bytes), following the page tables while the physical pages stay consecutive
/// RAM. `None` when the first page is not the job's (unmapped, kernel) or, when the host is
/// to write there (`host_writes`), not writable.
pub(crate) fn user_run(buffer: u64, len: u64, host_writes: bool) -> Option<Run> {
    let len = len.min(MAX_TRANSFER);
    if buffer.checked_add(len).is_none_or(|end| end > USER_END) {
        return None;
    }
    let ram_end = mm::ram_end();
    job::with_process(|process| {
        let mut start = None;
        let mut covered = 0u64;
        while covered < len {
            let Ok(page) = process.memory.aspace.translate(buffer + covered) else { break };
            if host_writes && !page.writable {
                break;
            }
            match start {
                None if page.physical >= ram_end => return Some(Run::Elsewhere { len: len.min(BOUNCE_SIZE) }),
                None => start = Some(page.physical),
                Some(first) if first + covered != page.physical || page.physical >= ram_end => break,
                Some(_) => {}
            }
            covered += page.bytes_left_in_leaf;
        }
        start.map(|gpa| Run::Ram { gpa, len: covered.min(len) })
    })
}

/// Whether `path` (not the job's own: the caller looked there first) goes to the host: any
/// path while an enclave job runs. The host, not this kernel, decides what the job may reach.
pub fn is_host_path(path: &str) -> bool {
    !path.is_empty() && super::is_active() && with_state(|state| !state.jobs.is_empty())
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
    const O_CLOEXEC: u32 = 0o2000000;
    let descriptor = job::with_process(|process| {
        process.descriptors.insert_flagged(Descriptor::Remote { handle: handle as u32, status_flags }, flags & O_CLOEXEC != 0)
    });
    match descriptor {
        Some(descriptor) => {
            // The first host file gives the process its descriptor table for the host.
            super::slots::ring3_publish(crate::sched::current_job());
            descriptor.0 as i64
        }
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
        FileAnswer::Result(error) => Err(if error < 0 { error } else { -EIO }),
    }
}

/// The host's handle behind `descriptor`, if it names a host file.
pub fn remote_handle(descriptor: crate::job::descriptors::Fd) -> Option<u32> {
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

/// `read`, or `pread64` when `offset` is given (the file's own offset stays): the whole
/// buffer, a request per run, stopping at a short read (the end of the file), as Linux reads a
/// regular file.
pub fn read(handle: u32, buffer: u64, len: u64, offset: Option<u64>) -> i64 {
    transfer_runs(buffer, len, true, |gpa, chunk, done| match offset {
        Some(offset) => FileOp::Pread { handle, gpa, len: chunk, offset: offset + done },
        None => FileOp::Read { handle, gpa, len: chunk },
    })
}

/// `write`: the whole buffer, a request per run, stopping at a short write.
pub fn write(handle: u32, buffer: u64, len: u64) -> i64 {
    transfer_runs(buffer, len, false, |gpa, chunk, _| FileOp::Write { handle, gpa, len: chunk })
}

/// `pwrite64`: like `write`, at `offset` (the file's own offset stays).
pub fn write_at(handle: u32, buffer: u64, len: u64, offset: u64) -> i64 {
    transfer_runs(buffer, len, false, |gpa, chunk, written| FileOp::Pwrite { handle, gpa, len: chunk, offset: offset + written })
}

/// Sends `op(gpa, length, bytes moved so far)` for each run of the buffer (the host writes
/// into it when `host_writes`); the count moved, or the first error if nothing was. Runs
/// outside RAM go through this CPU's bounce buffer.
fn transfer_runs(buffer: u64, len: u64, host_writes: bool, op: impl Fn(u64, u32, u64) -> FileOp<'static>) -> i64 {
    let mut done = 0u64;
    let partial = |done: u64, error: i64| if done == 0 { error } else { done as i64 };
    while done < len {
        let address = buffer + done;
        let (gpa, chunk, bounced) = match user_run(address, len - done, host_writes) {
            Some(Run::Ram { gpa, len }) => (gpa, len, false),
            Some(Run::Elsewhere { len }) => {
                let Some(bounce) = bounce() else { return partial(done, -ENOMEM) };
                if !host_writes && copy_from_user(phys::bytes_mut(bounce, len as usize), address).is_err() {
                    return partial(done, -EFAULT);
                }
                (bounce, len, true)
            }
            None => return partial(done, -EFAULT),
        };
        let answer = if bounced { request_here(op(gpa, chunk as u32, done)) } else { request(op(gpa, chunk as u32, done)) };
        let count = result_of(answer);
        if count < 0 {
            return partial(done, count);
        }
        let count = (count as u64).min(chunk);
        if bounced && host_writes && count > 0 && copy_to_user(address, phys::bytes(gpa, count as usize)).is_err() {
            return partial(done, -EFAULT);
        }
        done += count;
        if count < chunk {
            break;
        }
    }
    done as i64
}

/// `getdents64` of a host directory: one request for the next whole `linux_dirent64` records
/// that fit the buffer's first run (the host keeps the directory's position), through the
/// bounce buffer where the buffer is not RAM.
pub fn read_directory(handle: u32, buffer: u64, len: u64) -> i64 {
    let (gpa, len, bounced) = match user_run(buffer, len, true) {
        None => return -EFAULT,
        Some(Run::Ram { gpa, len }) => (gpa, len, false),
        Some(Run::Elsewhere { len }) => match bounce() {
            Some(bounce) => (bounce, len, true),
            None => return -ENOMEM,
        },
    };
    let getdents = FileOp::Getdents { handle, gpa, len: len as u32 };
    let count = result_of(if bounced { request_here(getdents) } else { request(getdents) });
    if bounced && count > 0 && copy_to_user(buffer, phys::bytes(gpa, count.min(len as i64) as usize)).is_err() {
        return -EFAULT;
    }
    count
}

/// Fills guest-physical `[physical, physical + len)`, the job's own memory (a private file
/// mapping being made), from host file `handle` at `offset`, the host writing there directly.
/// Returns the bytes read (fewer at the file's end), or a negated errno.
pub fn read_into_memory(handle: u32, physical: u64, len: u64, offset: u64) -> i64 {
    let mut done = 0u64;
    while done < len {
        let chunk = (len - done).min(MAX_TRANSFER);
        let count = result_of(request(FileOp::Pread { handle, gpa: physical + done, len: chunk as u32, offset: offset + done }));
        if count < 0 {
            return count;
        }
        done += (count as u64).min(chunk);
        if (count as u64) < chunk {
            break;
        }
    }
    done as i64
}

pub fn truncate(handle: u32, length: u64) -> i64 {
    result_of(request(FileOp::Ftruncate { handle, length }))
}

/// `[offset, offset + len)` of host file `handle` as a region the host adds (`mmap(MAP_SHARED)`):
/// its guest-physical address, or -errno.
pub fn map_shared(handle: u32, offset: u64, len: u64, writable: bool) -> i64 {
    result_of(request(FileOp::MapShared { handle, offset, len, writable }))
}

/// The region `map_shared` answered with `gpa` is no longer mapped: the host removes it.
pub fn unmap_shared(gpa: u64) -> i64 {
    result_of(request(FileOp::UnmapShared { gpa }))
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
        FileAnswer::Result(error) => Err(if error < 0 { error } else { -EIO }),
    }
}

/// `statfs` of a host path: Linux's `struct statfs`, which the host writes into this CPU's
/// bounce buffer (the job's buffer may cross runs), or a negated errno.
pub fn statfs_path(path: &str) -> Result<[u8; STATFS_LEN], i64> {
    statfs_through_bounce(|gpa| FileOp::Statfs { path: path.as_bytes(), gpa })
}

/// `fstatfs` of host file `handle`, as `statfs_path`.
pub fn statfs_handle(handle: u32) -> Result<[u8; STATFS_LEN], i64> {
    statfs_through_bounce(|gpa| FileOp::Fstatfs { handle, gpa })
}

fn statfs_through_bounce<'a>(op: impl FnOnce(u64) -> FileOp<'a>) -> Result<[u8; STATFS_LEN], i64> {
    let bounce = bounce().ok_or(-ENOMEM)?;
    let result = result_of(request_here(op(bounce)));
    if result < 0 {
        return Err(result);
    }
    let mut record = [0; STATFS_LEN];
    record.copy_from_slice(phys::bytes(bounce, STATFS_LEN));
    Ok(record)
}

/// The host's attributes as the job's `struct stat`.
pub fn stat_record(attributes: &FileAttributes) -> [u8; core::mem::size_of::<crate::linux::stat>()] {
    let (accessed, modified, changed) = (attributes.accessed, attributes.modified, attributes.changed);
    crate::linux_struct!(crate::linux::stat {
        st_ino: attributes.inode,
        st_nlink: attributes.links,
        st_mode: attributes.mode,
        st_uid: attributes.uid,
        st_gid: attributes.gid,
        st_size: attributes.size as i64,
        st_blksize: attributes.block_size as i64,
        st_blocks: attributes.blocks as i64,
        st_atime: accessed.seconds as u64,
        st_atime_nsec: accessed.nanoseconds as u64,
        st_mtime: modified.seconds as u64,
        st_mtime_nsec: modified.nanoseconds as u64,
        st_ctime: changed.seconds as u64,
        st_ctime_nsec: changed.nanoseconds as u64,
    })
}

/// A forwarded call's result as a system call's: negative values are negated errnos.
pub fn to_syscall_result(value: i64) -> crate::syscall::SyscallResult {
    if value < 0 {
        Err(Errno(value.unsigned_abs()))
    } else {
        Ok(value as u64)
    }
}
