//! The host side of the LWK's ring-3 file calls (`enclave_proto::slots`, `RING3_*`): open,
//! openat, close, read, write, pread64, pwrite64, lseek, fstat, stat, lstat and newfstatat
//! that a job's code posts in its own request page, served by the enclave's pump while it
//! polls the file slots, with no guest-kernel work on the way.
//!
//! Open and close change the process's descriptor table, which the kernel shares with the
//! host (`RING3_FD_*`): under the table's lock the host hands out the lowest free number (as
//! Linux would; none free below `RING3_FDS`: the kernel decides) and closes only a host file
//! no other descriptor or process shares. Every open the host does not handle the way the
//! kernel path would (flags other than the access mode, O_CREAT, O_EXCL, O_NOCTTY, O_TRUNC,
//! O_APPEND, O_LARGEFILE, O_NOFOLLOW, O_CLOEXEC; `/dev`, `/proc`, `/sys`; a `..`; the job's
//! own files) and a table the kernel holds locked for long go to the kernel before anything
//! is done, so a call never runs twice.
//!
//! Nothing the job writes is trusted. Who asks (the job, hence whose rights the call carries),
//! which process (its page-table root) and which host file a descriptor names (its descriptor
//! table) come from the words the kernel keeps per CPU in the control page, which the job
//! cannot write; the job supplies only the call and its arguments. Buffers are found by
//! walking that process's page tables: only present user pages of the enclave's RAM, and only
//! writable ones for what the host writes; anything else (a page not yet mapped, memory
//! outside RAM) sends the call back to the kernel path (`RING3_ESCALATE`) before anything is
//! done, so the kernel answers it exactly as Linux (faulting pages in, EFAULT). The call itself
//! is served as one from the channel (`Enclave::serve_file_request`: the job's user, its
//! confinement, Linux errnos).

use std::sync::atomic::{AtomicU64, Ordering};

use enclave_proto::slots::{
    self, ANSWERED, POSTED, RING3_ARGS, RING3_CALL, RING3_CONTEXT, RING3_CONTEXT_SIZE, RING3_ESCALATE, RING3_FDS, RING3_FD_CHANGED,
    RING3_FD_CLOEXEC, RING3_FD_ENTRIES, RING3_FD_KERNEL, RING3_FD_LOCK, RING3_FD_SOLE, RING3_FD_STATUS_SHIFT, RING3_FD_TABLE,
    RING3_FD_TABLE_SIZE, RING3_HOST_AWAKE, RING3_JOB, RING3_JOB_FILES, RING3_JOB_FILES_LEN, RING3_PATH, RING3_PATH_CAPACITY, RING3_REQUEST,
    RING3_RESULT, RING3_ROOT, RING3_SLOT_SIZE, RING3_STATE, RING3_TAKEN,
};
use enclave_proto::{FileAttributes, FileOp, HostMessage};

use crate::guest_ram::GuestRam;

/// Linux's numbers for the calls served here.
const READ: u64 = 0;
const WRITE: u64 = 1;
const OPEN: u64 = 2;
const CLOSE: u64 = 3;
const OPENAT: u64 = 257;
const STAT: u64 = 4;
const FSTAT: u64 = 5;
const LSTAT: u64 = 6;
const LSEEK: u64 = 8;
const PREAD64: u64 = 17;
const PWRITE64: u64 = 18;
const NEWFSTATAT: u64 = 262;
const AT_FDCWD: i32 = -100;
const AT_EMPTY_PATH: u64 = 0x1000;
/// The open flags served here; any other sends the open to the kernel. Of them, what F_GETFL
/// keeps: the access mode and O_APPEND (as the kernel path keeps them).
const OPEN_FLAGS: u32 =
    (libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        as u32
        | O_LARGEFILE;
/// x86-64 Linux's O_LARGEFILE, which musl passes and the kernel ignores (the libc crate has 0
/// for it here).
const O_LARGEFILE: u32 = 0o100000;
const STATUS_FLAGS: u32 = (libc::O_ACCMODE | libc::O_APPEND) as u32;
/// The lock word's value while the host holds it, and how many times the host tries to take
/// it before it leaves the call to the kernel (which holds it for a few of its instructions;
/// a kernel that keeps it only loses its job's fast calls).
const HOST_HOLDS: u64 = 2;
const LOCK_TRIES: u32 = 10_000;
/// `struct stat` on x86-64.
const STAT_SIZE: usize = 144;
/// Bytes one host read or write moves at most (`hio::MAX_TRANSFER`); a longer run is split.
const MAX_CHUNK: u64 = 64 << 20;

type AnswerOf<'a> = dyn Fn(u32, u32, &FileOp<'_>) -> HostMessage<'static> + 'a;

/// An aligned word of guest RAM at `gpa`, for the compare-and-swap and the state words the
/// job spins on.
fn word(ram: &GuestRam, gpa: u64) -> Option<&AtomicU64> {
    if gpa % 8 != 0 {
        return None;
    }
    let (_, offset) = ram.file_range(gpa, 8).ok()?;
    let address = ram.host_address(offset, 8)?;
    // SAFETY: an aligned word inside the RAM mapping (checked above), which lives as long as
    // `ram`; the guest writes it concurrently, hence an atomic.
    Some(unsafe { &*(address as *const AtomicU64) })
}

fn read_u64(ram: &GuestRam, gpa: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    ram.read(gpa, &mut bytes).ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// The page-table entry bits the walk checks.
const PRESENT: u64 = 1;
const WRITABLE: u64 = 2;
const USER_ACCESS: u64 = 4;
const LARGE: u64 = 0x80;
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;

/// The guest-physical address of user virtual address `va` in the page tables at `root`, and
/// the bytes left in its page: `None` unless every level is present and user-accessible (and
/// writable, when `write`) and the page is RAM.
pub fn translate(ram: &GuestRam, root: u64, va: u64, write: bool) -> Option<(u64, u64)> {
    if va >= 1 << 47 {
        return None;
    }
    let required = PRESENT | USER_ACCESS | if write { WRITABLE } else { 0 };
    let mut table = root & ADDRESS_MASK;
    for level in (0..4).rev() {
        let shift = 12 + 9 * level;
        let entry = read_u64(ram, table + ((va >> shift) & 511) * 8)?;
        if entry & required != required {
            return None;
        }
        let page_size = 1u64 << shift;
        if level == 0 || (entry & LARGE != 0 && level <= 2) {
            let frame = entry & ADDRESS_MASK & !(page_size - 1);
            let offset = va & (page_size - 1);
            return Some((frame + offset, page_size - offset));
        }
        table = entry & ADDRESS_MASK;
    }
    None
}

/// The guest-physical runs under user buffer `[va, va + len)`, consecutive pages merged;
/// `None` if any byte of it is not mapped as [`translate`] requires.
pub fn runs(ram: &GuestRam, root: u64, va: u64, len: u64, write: bool) -> Option<Vec<(u64, u64)>> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut done = 0u64;
    while done < len {
        let (gpa, left) = translate(ram, root, va.checked_add(done)?, write)?;
        let take = left.min(len - done);
        ram.file_range(gpa, take).ok()?;
        match runs.last_mut() {
            Some((start, run)) if *start + *run == gpa => *run += take,
            _ => runs.push((gpa, take)),
        }
        done += take;
    }
    Some(runs)
}

/// What the kernel says about the process running on one CPU.
struct Context {
    root: u64,
    fd_table: u64,
    job: u32,
    request: u64,
}

fn context(ram: &GuestRam, control: u64, cpu: u16) -> Option<Context> {
    let base = control + RING3_CONTEXT + cpu as u64 * RING3_CONTEXT_SIZE;
    let root = read_u64(ram, base + RING3_ROOT)?;
    let request = read_u64(ram, base + RING3_REQUEST)?;
    (root != 0 && request != 0).then_some(Context {
        root,
        fd_table: read_u64(ram, base + RING3_FD_TABLE)?,
        job: read_u64(ram, base + RING3_JOB)? as u32,
        request: request + cpu as u64 * RING3_SLOT_SIZE,
    })
}

/// Serves the ring-3 call posted on CPU `cpu`, if there is one; whether there was.
pub fn serve_cpu(ram: &GuestRam, control: u64, cpu: u16, answer_of: &AnswerOf<'_>) -> bool {
    let Some(context) = context(ram, control, cpu) else { return false };
    let Some(state) = word(ram, context.request + RING3_STATE) else { return false };
    if state.load(Ordering::SeqCst) != POSTED || state.compare_exchange(POSTED, RING3_TAKEN, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return false;
    }
    let result = serve(ram, control, &context, answer_of).unwrap_or(RING3_ESCALATE);
    if let Some(result_word) = word(ram, context.request + RING3_RESULT) {
        result_word.store(result as u64, Ordering::SeqCst);
    }
    state.store(ANSWERED, Ordering::SeqCst);
    true
}

/// The call in `context`'s slot, served: its result, or `None` to send it to the kernel.
fn serve(ram: &GuestRam, control: u64, context: &Context, answer_of: &AnswerOf<'_>) -> Option<i64> {
    let mut header = [0u8; (RING3_PATH - RING3_CALL) as usize];
    ram.read(context.request + RING3_CALL, &mut header).ok()?;
    let field = |offset: u64| {
        let at = (offset - RING3_CALL) as usize;
        u64::from_le_bytes(header[at..at + 8].try_into().unwrap())
    };
    let call = field(RING3_CALL);
    let arg = |index: u64| field(RING3_ARGS + index * 8);
    let handle = |fd: u64| host_handle(ram, context, fd);
    let value = |op: FileOp<'_>| match answer_of(context.job, 0, &op) {
        HostMessage::FileResult { result, .. } => result,
        _ => -(libc::EIO as i64),
    };
    match call {
        READ | PREAD64 | WRITE | PWRITE64 => {
            let handle = handle(arg(0))?;
            let (buffer, len, offset) = (arg(1), arg(2), (call == PREAD64 || call == PWRITE64).then(|| arg(3)));
            let into_guest = call == READ || call == PREAD64;
            let runs = runs(ram, context.root, buffer, len, into_guest)?;
            let mut done = 0u64;
            for (gpa, run) in runs {
                let mut moved = 0u64;
                while moved < run {
                    let chunk = (run - moved).min(MAX_CHUNK) as u32;
                    let (gpa, at) = (gpa + moved, offset.map(|offset| offset.wrapping_add(done)));
                    let op = match (into_guest, at) {
                        (true, None) => FileOp::Read { handle, gpa, len: chunk },
                        (true, Some(offset)) => FileOp::Pread { handle, gpa, len: chunk, offset },
                        (false, None) => FileOp::Write { handle, gpa, len: chunk },
                        (false, Some(offset)) => FileOp::Pwrite { handle, gpa, len: chunk, offset },
                    };
                    let count = value(op);
                    if count < 0 {
                        return Some(if done == 0 { count } else { done as i64 });
                    }
                    let count = (count as u64).min(chunk as u64);
                    moved += count;
                    done += count;
                    if count < chunk as u64 {
                        return Some(done as i64);
                    }
                }
            }
            Some(done as i64)
        }
        OPEN | OPENAT => {
            let (directory, flags, mode) = match call {
                OPENAT => (arg(0) as i32, arg(2) as u32, arg(3) as u32),
                _ => (AT_FDCWD, arg(1) as u32, arg(2) as u32),
            };
            if flags & !OPEN_FLAGS != 0 || flags & libc::O_ACCMODE as u32 == libc::O_ACCMODE as u32 {
                return None;
            }
            let path = slot_path(ram, context)?;
            if path.is_empty() || (directory != AT_FDCWD && path[0] != b'/') || is_special(&path) || is_kernels(ram, control, &path) {
                return None;
            }
            open_descriptor(ram, context, FileOp::Open { path: &path, flags, mode }, answer_of)
        }
        CLOSE => close_descriptor(ram, context, arg(0), answer_of),
        LSEEK => Some(value(FileOp::Lseek { handle: handle(arg(0))?, offset: arg(1) as i64, whence: arg(2) as u32 })),
        FSTAT => stat_into(ram, context, arg(1), FileOp::Fstat { handle: handle(arg(0))? }, answer_of),
        STAT | LSTAT | NEWFSTATAT => {
            let (directory, statbuf, flags) = match call {
                NEWFSTATAT => (arg(0) as i32, arg(2), arg(3)),
                _ => (AT_FDCWD, arg(1), 0),
            };
            let path = slot_path(ram, context)?;
            let path = path.as_slice();
            if path.is_empty() && flags & AT_EMPTY_PATH != 0 && call == NEWFSTATAT {
                return stat_into(ram, context, statbuf, FileOp::Fstat { handle: handle(directory as u32 as u64)? }, answer_of);
            }
            // Relative to another directory (the job's own), empty, the kernel's device or one
            // of the job's own files: the kernel's to answer.
            if path.is_empty() || (directory != AT_FDCWD && path[0] != b'/') || is_kernels(ram, control, path) {
                return None;
            }
            stat_into(ram, context, statbuf, FileOp::Stat { path }, answer_of)
        }
        _ => None,
    }
}

/// The NUL-terminated path copied into the slot (`None` without its NUL).
fn slot_path(ram: &GuestRam, context: &Context) -> Option<Vec<u8>> {
    let mut path = vec![0u8; RING3_PATH_CAPACITY as usize];
    ram.read(context.request + RING3_PATH, &mut path).ok()?;
    path.truncate(path.iter().position(|&byte| byte == 0)?);
    Some(path)
}

/// Whether an open of `path` is unusual enough to leave to the kernel: a `..` (the spelling
/// may lead anywhere) or the host's device and process trees.
fn is_special(path: &[u8]) -> bool {
    let mut parts = path.split(|&byte| byte == b'/').filter(|part| !part.is_empty() && *part != b".");
    let first = if path.starts_with(b"/") { parts.clone().next() } else { None };
    parts.any(|part| part == b"..") || matches!(first, Some(b"dev" | b"proc" | b"sys"))
}

/// The process's descriptor table (`RING3_FD_*`), if the kernel gave one and it is RAM.
fn fd_table<'a>(ram: &'a GuestRam, context: &Context) -> Option<&'a [AtomicU64]> {
    if context.fd_table == 0 || context.fd_table % 8 != 0 {
        return None;
    }
    let (_, offset) = ram.file_range(context.fd_table, RING3_FD_TABLE_SIZE).ok()?;
    let address = ram.host_address(offset, RING3_FD_TABLE_SIZE)?;
    // SAFETY: aligned words inside the RAM mapping (checked above), which lives as long as
    // `ram`; the kernel writes them concurrently, hence atomics.
    Some(unsafe { std::slice::from_raw_parts(address as *const AtomicU64, (RING3_FD_TABLE_SIZE / 8) as usize) })
}

/// The table's lock, held by the host until dropped.
struct TableLock<'a>(&'a AtomicU64);

impl TableLock<'_> {
    fn take(table: &[AtomicU64]) -> Option<TableLock<'_>> {
        let lock = &table[(RING3_FD_LOCK / 8) as usize];
        for _ in 0..LOCK_TRIES {
            if lock.compare_exchange(0, HOST_HOLDS, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                return Some(TableLock(lock));
            }
            std::hint::spin_loop();
        }
        None
    }
}

impl Drop for TableLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::SeqCst);
    }
}

fn entry(table: &[AtomicU64], fd: u64) -> &AtomicU64 {
    &table[(RING3_FD_ENTRIES / 8 + fd) as usize]
}

/// Whether an entry is a host file (a handle, not free and not the kernel's).
fn is_host_file(entry: u64) -> bool {
    entry != 0 && entry & RING3_FD_KERNEL == 0
}

/// The host handle behind descriptor `fd` in the kernel's table, if it names a host file.
fn host_handle(ram: &GuestRam, context: &Context, fd: u64) -> Option<u32> {
    if fd >= RING3_FDS {
        return None;
    }
    let value = entry(fd_table(ram, context)?, fd).load(Ordering::SeqCst);
    is_host_file(value).then_some(value as u32).and_then(|handle| handle.checked_sub(1))
}

/// Opens a host file (`op`, an `Open`) at the lowest free descriptor: the descriptor, the
/// host's errno, or `None` (nothing done) when the table is locked or has no free number.
fn open_descriptor(ram: &GuestRam, context: &Context, op: FileOp<'_>, answer_of: &AnswerOf<'_>) -> Option<i64> {
    let FileOp::Open { flags, .. } = op else { return None };
    let table = fd_table(ram, context)?;
    let _lock = TableLock::take(table)?;
    let fd = (0..RING3_FDS).find(|&fd| entry(table, fd).load(Ordering::SeqCst) == 0)?;
    let handle = match answer_of(context.job, 0, &op) {
        HostMessage::FileResult { result, .. } => result,
        _ => -(libc::EIO as i64),
    };
    if handle < 0 {
        return Some(handle);
    }
    let Some(stored) = u32::try_from(handle).ok().and_then(|handle| handle.checked_add(1)) else {
        answer_of(context.job, 0, &FileOp::Close { handle: handle as u32 });
        return Some(-(libc::EMFILE as i64));
    };
    let cloexec = if flags & libc::O_CLOEXEC as u32 != 0 { RING3_FD_CLOEXEC } else { 0 };
    let status = ((flags & STATUS_FLAGS) as u64) << RING3_FD_STATUS_SHIFT;
    entry(table, fd).store(stored as u64 | RING3_FD_SOLE | cloexec | status, Ordering::SeqCst);
    table[(RING3_FD_CHANGED / 8) as usize].store(1, Ordering::SeqCst);
    Some(fd as i64)
}

/// Closes descriptor `fd` if it is a host file no other descriptor or process shares: 0 (as
/// the kernel path, whatever the host's close said), or `None` to leave it to the kernel.
fn close_descriptor(ram: &GuestRam, context: &Context, fd: u64, answer_of: &AnswerOf<'_>) -> Option<i64> {
    if fd >= RING3_FDS {
        return None;
    }
    let table = fd_table(ram, context)?;
    let _lock = TableLock::take(table)?;
    let value = entry(table, fd).load(Ordering::SeqCst);
    if !is_host_file(value) || value & RING3_FD_SOLE == 0 {
        return None;
    }
    answer_of(context.job, 0, &FileOp::Close { handle: (value as u32).wrapping_sub(1) });
    entry(table, fd).store(0, Ordering::SeqCst);
    table[(RING3_FD_CHANGED / 8) as usize].store(1, Ordering::SeqCst);
    Some(0)
}

/// Whether the kernel answers for `path` itself: `/dev/xpmem` or one of the job's in-memory
/// files (the list the kernel keeps in the control page), however it is spelled from `/` (the
/// kernel resolves it so). An unreadable list sends every path to the kernel.
fn is_kernels(ram: &GuestRam, control: u64, path: &[u8]) -> bool {
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in path.split(|&byte| byte == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    if parts == [b"dev".as_slice(), b"xpmem".as_slice()] {
        return true;
    }
    let normalized: Vec<u8> =
        if parts.is_empty() { b"/".to_vec() } else { parts.iter().flat_map(|part| [b"/".as_slice(), part]).flatten().copied().collect() };
    let (Some(list), Some(length)) = (read_u64(ram, control + RING3_JOB_FILES), read_u64(ram, control + RING3_JOB_FILES_LEN)) else {
        return true;
    };
    if length == 0 {
        return false;
    }
    let mut names = vec![0u8; length.min(slots::PAGE_SIZE) as usize];
    if ram.read(list, &mut names).is_err() {
        return true;
    }
    names.split(|&byte| byte == 0).any(|name| name == normalized.as_slice())
}

/// Serves a stat call and writes its `struct stat` at user address `statbuf`, as the kernel
/// path does; `None` when that buffer is not mapped writable (the kernel decides then).
fn stat_into(ram: &GuestRam, context: &Context, statbuf: u64, op: FileOp<'_>, answer_of: &AnswerOf<'_>) -> Option<i64> {
    let runs = runs(ram, context.root, statbuf, STAT_SIZE as u64, true)?;
    match answer_of(context.job, 0, &op) {
        HostMessage::FileAttributes { attributes, .. } => {
            let record = stat_record(&attributes);
            let mut written = 0usize;
            for (gpa, len) in runs {
                ram.write(gpa, &record[written..written + len as usize]).ok()?;
                written += len as usize;
            }
            Some(0)
        }
        HostMessage::FileResult { result, .. } if result < 0 => Some(result),
        _ => Some(-(libc::EIO as i64)),
    }
}

/// The kernel's `struct stat` for host attributes (`files::stat_record` in the LWK: the same
/// fields set, the rest zero).
pub fn stat_record(attributes: &FileAttributes) -> [u8; STAT_SIZE] {
    let mut record = [0u8; STAT_SIZE];
    let mut put = |offset: usize, bytes: &[u8]| record[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(8, &attributes.inode.to_le_bytes());
    put(16, &attributes.links.to_le_bytes());
    put(24, &attributes.mode.to_le_bytes());
    put(28, &attributes.uid.to_le_bytes());
    put(32, &attributes.gid.to_le_bytes());
    put(48, &attributes.size.to_le_bytes());
    put(56, &(attributes.block_size as u64).to_le_bytes());
    put(64, &attributes.blocks.to_le_bytes());
    for (offset, time) in [(72, attributes.accessed), (88, attributes.modified), (104, attributes.changed)] {
        put(offset, &time.seconds.to_le_bytes());
        put(offset + 8, &(time.nanoseconds as u64).to_le_bytes());
    }
    record
}

/// Tells the job's code on every CPU whether the pump polls (`RING3_HOST_AWAKE` in its slot).
pub fn set_awake(ram: &GuestRam, control: u64, count: u16, awake: bool) {
    for cpu in 0..count.min(slots::MAX_SLOTS) {
        if let Some(awake_word) = context(ram, control, cpu).and_then(|context| word(ram, context.request + RING3_HOST_AWAKE)) {
            awake_word.store(awake as u64, Ordering::SeqCst);
        }
    }
}

/// Serves every CPU's posted ring-3 call once; whether any was.
pub fn serve_all(ram: &GuestRam, control: u64, count: u16, answer_of: &AnswerOf<'_>) -> bool {
    let mut served = false;
    for cpu in 0..count.min(slots::MAX_SLOTS) {
        served |= serve_cpu(ram, control, cpu, answer_of);
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_ram::RamRange;
    use enclave_proto::Timestamp;
    use std::cell::RefCell;

    const RAM: u64 = 1 << 20;
    const CONTROL: u64 = 0x10000;
    const ROOT: u64 = 0x20000;
    const FD_TABLE: u64 = 0x34000;
    const REQUESTS: u64 = 0x35000;
    /// User pages: read-write at `USER` (RAM 0x30000), read-only next (0x31000), then a
    /// supervisor page (0x32000).
    const USER: u64 = 0x40_0000;
    const JOB: u32 = 9;

    fn put(ram: &GuestRam, gpa: u64, value: u64) {
        ram.write(gpa, &value.to_le_bytes()).unwrap();
    }

    fn ram() -> GuestRam {
        let memfd = crate::sys::memfd("ring3-files-test").unwrap();
        memfd.set_len(RAM).unwrap();
        let ram = GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: RAM, file_offset: 0 }], (RAM - 0x4000, 0x4000)).unwrap();
        // PML4[0] -> PDPT[0] -> PD[2] -> PT: three 4 KiB pages at USER.
        put(&ram, ROOT, 0x21000 | PRESENT | WRITABLE | USER_BIT);
        put(&ram, 0x21000, 0x22000 | PRESENT | WRITABLE | USER_BIT);
        put(&ram, 0x22000 + 2 * 8, 0x23000 | PRESENT | WRITABLE | USER_BIT);
        put(&ram, 0x23000, 0x30000 | PRESENT | WRITABLE | USER_BIT);
        put(&ram, 0x23008, 0x31000 | PRESENT | USER_BIT);
        put(&ram, 0x23010, 0x32000 | PRESENT | WRITABLE);
        let context = CONTROL + RING3_CONTEXT;
        put(&ram, context + RING3_ROOT, ROOT);
        put(&ram, context + RING3_FD_TABLE, FD_TABLE);
        put(&ram, context + RING3_JOB, JOB as u64);
        put(&ram, context + RING3_REQUEST, REQUESTS);
        for fd in 0..3 {
            put(&ram, FD_TABLE + RING3_FD_ENTRIES + fd * 8, RING3_FD_KERNEL); // the console
        }
        put(&ram, FD_TABLE + RING3_FD_ENTRIES + 3 * 8, 8 | RING3_FD_SOLE); // descriptor 3: handle 7
        let names = b"/\0/fileio\0";
        ram.write(0x36000, names).unwrap();
        put(&ram, CONTROL + RING3_JOB_FILES, 0x36000);
        put(&ram, CONTROL + RING3_JOB_FILES_LEN, names.len() as u64);
        ram
    }
    const USER_BIT: u64 = USER_ACCESS;

    /// Posts `call(args)` (with `path`) on CPU 0, serves it, and returns its result and the
    /// operations the host was asked for.
    fn call(ram: &GuestRam, number: u64, args: [u64; 4], path: &[u8]) -> (i64, Vec<String>) {
        put(ram, REQUESTS + RING3_CALL, number);
        for (index, arg) in args.iter().enumerate() {
            put(ram, REQUESTS + RING3_ARGS + index as u64 * 8, *arg);
        }
        let mut with_nul = path.to_vec();
        with_nul.push(0);
        ram.write(REQUESTS + RING3_PATH, &with_nul).unwrap();
        put(ram, REQUESTS + RING3_STATE, POSTED);
        let asked = RefCell::new(Vec::new());
        let answer_of = |job: u32, request: u32, op: &FileOp<'_>| {
            assert_eq!(job, JOB, "the kernel's job, not the caller's say");
            asked.borrow_mut().push(format!("{op:?}"));
            match op {
                FileOp::Read { len, .. } | FileOp::Write { len, .. } => HostMessage::FileResult { job, request, result: *len as i64 },
                FileOp::Open { path: b"missing", .. } => HostMessage::FileResult { job, request, result: -(libc::ENOENT as i64) },
                FileOp::Open { .. } => HostMessage::FileResult { job, request, result: 41 },
                FileOp::Close { .. } => HostMessage::FileResult { job, request, result: 0 },
                FileOp::Stat { .. } | FileOp::Fstat { .. } => {
                    let time = Timestamp { seconds: 1, nanoseconds: 2 };
                    let attributes = FileAttributes {
                        mode: 0o100644,
                        size: 42,
                        inode: 5,
                        links: 1,
                        uid: 1000,
                        gid: 1000,
                        block_size: 4096,
                        blocks: 8,
                        accessed: time,
                        modified: time,
                        changed: time,
                    };
                    HostMessage::FileAttributes { job, request, attributes }
                }
                _ => HostMessage::FileResult { job, request, result: -(libc::ENOSYS as i64) },
            }
        };
        assert!(serve_cpu(ram, CONTROL, 0, &answer_of), "a posted call is served");
        assert_eq!(read_u64(ram, REQUESTS + RING3_STATE), Some(ANSWERED));
        (read_u64(ram, REQUESTS + RING3_RESULT).unwrap() as i64, asked.into_inner())
    }

    #[test]
    fn calls_reach_the_callers_pages_through_its_page_tables() {
        let ram = ram();
        let (result, asked) = call(&ram, READ, [3, USER + 0x100, 0x100, 0], b"");
        assert_eq!((result, asked), (0x100, vec![format!("{:?}", FileOp::Read { handle: 7, gpa: 0x30100, len: 0x100 })]));
        let (result, asked) = call(&ram, WRITE, [3, USER + 0x1000, 16, 0], b"");
        assert_eq!((result, asked.len()), (16, 1), "a read-only page may be written from");
        let (result, _) = call(&ram, STAT, [0, USER + 8, 0, 0], b"data");
        assert_eq!(result, 0);
        let mut record = [0u8; STAT_SIZE];
        ram.read(0x30008, &mut record).unwrap();
        assert_eq!(&record[48..56], &42u64.to_le_bytes(), "st_size in the caller's buffer");
    }

    /// Whatever the job names, the host touches only its own user pages and host files, and
    /// leaves the rest to the kernel.
    #[test]
    fn what_the_host_may_not_do_goes_to_the_kernel() {
        let ram = ram();
        let cases: [(u64, [u64; 4], &[u8], &str); 8] = [
            (READ, [3, USER + 0xf00, 0x200, 0], b"", "read into a read-only page"),
            (READ, [3, USER + 0x2000, 8, 0], b"", "a supervisor page"),
            (READ, [3, USER + 0x3000, 8, 0], b"", "an unmapped page"),
            (READ, [4, USER, 8, 0], b"", "a descriptor that is not a host file"),
            (READ, [RING3_FDS + 3, USER, 8, 0], b"", "past the table"),
            (STAT, [0, USER + 0x1000, 0, 0], b"data", "stat into a read-only page"),
            (STAT, [0, USER, 0, 0], b"/x/../fileio", "the job's own file"),
            (NEWFSTATAT, [5, b"data".as_ptr() as u64, USER, 0], b"data", "relative to a directory descriptor"),
        ];
        for (number, args, path, what) in cases {
            let (result, asked) = call(&ram, number, args, path);
            assert_eq!((result, asked.len()), (RING3_ESCALATE, 0), "{what}");
        }
        let (result, _) = call(&ram, STAT, [0, USER, 0, 0], b"dev/../../dev/./xpmem");
        assert_eq!(result, RING3_ESCALATE, "the kernel's device");
        // No call posted, or no process known on that CPU: nothing is served.
        assert!(!serve_cpu(&ram, CONTROL, 0, &|_, _, _| panic!("nothing to serve")));
        assert!(!serve_cpu(&ram, CONTROL, 1, &|_, _, _| panic!("no context")));
    }

    fn fd_entry(ram: &GuestRam, fd: u64) -> u64 {
        read_u64(ram, FD_TABLE + RING3_FD_ENTRIES + fd * 8).unwrap()
    }

    /// Open takes the lowest free number under the table's lock and tells the kernel; close
    /// frees a host file nothing else shares; both leave the lock free.
    #[test]
    fn open_and_close_keep_the_kernels_descriptor_table() {
        let ram = ram();
        put(&ram, FD_TABLE + RING3_FD_ENTRIES + 5 * 8, RING3_FD_KERNEL); // a pipe at 5
        let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC) as u64 | O_LARGEFILE as u64;
        let (result, asked) = call(&ram, OPEN, [0, flags, 0o600, 0], b"out");
        assert_eq!(result, 4, "the lowest free number");
        assert_eq!(asked, vec![format!("{:?}", FileOp::Open { path: b"out", flags: flags as u32, mode: 0o600 })]);
        let status = ((libc::O_WRONLY | libc::O_APPEND) as u64) << RING3_FD_STATUS_SHIFT;
        assert_eq!(fd_entry(&ram, 4), 42 | RING3_FD_SOLE | RING3_FD_CLOEXEC | status);
        assert_eq!(read_u64(&ram, FD_TABLE + RING3_FD_CHANGED), Some(1), "the kernel is told");
        let (result, _) = call(&ram, OPENAT, [AT_FDCWD as u32 as u64, b"x".as_ptr() as u64, libc::O_RDONLY as u64, 0], b"/data/in");
        assert_eq!(result, 6, "past the pipe");
        let (result, _) = call(&ram, OPEN, [0, 0, 0, 0], b"missing");
        assert_eq!((result, fd_entry(&ram, 7)), (-(libc::ENOENT as i64), 0), "the host's errno, no descriptor");
        let (result, asked) = call(&ram, CLOSE, [4, 0, 0, 0], b"");
        assert_eq!((result, fd_entry(&ram, 4)), (0, 0));
        assert_eq!(asked, vec![format!("{:?}", FileOp::Close { handle: 41 })]);
        let (result, _) = call(&ram, OPEN, [0, 0, 0, 0], b"again");
        assert_eq!(result, 4, "the freed number first");
        assert_eq!(read_u64(&ram, FD_TABLE + RING3_FD_LOCK), Some(0), "the lock is left free");
    }

    /// Whatever the job asks, and whatever state the table is in, an open or close the host
    /// should not make goes to the kernel with nothing done.
    #[test]
    fn unusual_opens_and_closes_go_to_the_kernel() {
        let ram = ram();
        put(&ram, FD_TABLE + RING3_FD_ENTRIES + 4 * 8, 12); // a host file another descriptor shares
        let cases: [(u64, [u64; 4], &[u8], &str); 15] = [
            (OPEN, [0, libc::O_DIRECTORY as u64, 0, 0], b"d", "O_DIRECTORY"),
            (OPEN, [0, libc::O_PATH as u64, 0, 0], b"d", "O_PATH"),
            (OPEN, [0, libc::O_TMPFILE as u64, 0, 0], b"d", "O_TMPFILE"),
            (OPEN, [0, 3, 0, 0], b"d", "access mode 3"),
            (OPEN, [0, 0, 0, 0], b"/dev/null", "a device"),
            (OPEN, [0, 0, 0, 0], b"//proc/self/status", "the process tree"),
            (OPEN, [0, 0, 0, 0], b"a/../../etc/x", "a .."),
            (OPEN, [0, 0, 0, 0], b"/fileio", "the job's own file"),
            (OPEN, [0, 0, 0, 0], b"", "an empty path"),
            (OPENAT, [5, 0, 0, 0], b"data", "relative to a directory descriptor"),
            (CLOSE, [4, 0, 0, 0], b"", "a shared host file"),
            (CLOSE, [1, 0, 0, 0], b"", "the kernel's"),
            (CLOSE, [9, 0, 0, 0], b"", "not open"),
            (CLOSE, [RING3_FDS, 0, 0, 0], b"", "past the table"),
            (CLOSE, [u64::MAX, 0, 0, 0], b"", "a negative descriptor"),
        ];
        for (number, args, path, what) in cases {
            let (result, asked) = call(&ram, number, args, path);
            assert_eq!((result, asked.len()), (RING3_ESCALATE, 0), "{what}");
        }
        // The kernel holds the lock: nothing is done.
        put(&ram, FD_TABLE + RING3_FD_LOCK, 1);
        assert_eq!(call(&ram, OPEN, [0, 0, 0, 0], b"data"), (RING3_ESCALATE, vec![]), "locked");
        assert_eq!(call(&ram, CLOSE, [3, 0, 0, 0], b""), (RING3_ESCALATE, vec![]), "locked");
        assert_eq!(read_u64(&ram, FD_TABLE + RING3_FD_LOCK), Some(1), "the kernel's lock is left alone");
        put(&ram, FD_TABLE + RING3_FD_LOCK, 0);
        // No free number below RING3_FDS: the kernel decides (a higher one, or EMFILE).
        for fd in 0..RING3_FDS {
            put(&ram, FD_TABLE + RING3_FD_ENTRIES + fd * 8, RING3_FD_KERNEL);
        }
        assert_eq!(call(&ram, OPEN, [0, 0, 0, 0], b"data"), (RING3_ESCALATE, vec![]), "full");
        // A table outside RAM or unaligned: nothing either.
        for bad in [RAM - 8, FD_TABLE + 4] {
            put(&ram, CONTROL + RING3_CONTEXT + RING3_FD_TABLE, bad);
            assert_eq!(call(&ram, OPEN, [0, 0, 0, 0], b"data"), (RING3_ESCALATE, vec![]), "table at {bad:#x}");
        }
    }

    #[test]
    fn large_pages_translate() {
        let ram = ram();
        put(&ram, 0x22000 + 3 * 8, PRESENT | WRITABLE | USER_BIT | LARGE);
        assert_eq!(translate(&ram, ROOT, 0x60_1234, true), Some((0x1234, 0x20_0000 - 0x1234)));
        assert_eq!(translate(&ram, ROOT, 1 << 47, false), None, "not a user address");
    }
}
