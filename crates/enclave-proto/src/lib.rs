#![no_std]
//! The messages on the enclave channel between `clowderd` (the host) and the lightweight kernel
//! (the enclave), in the manner of Pisces' control messages and Kitten's HIO: the host launches,
//! signals and kills jobs and pings the kernel; the kernel streams job output back, reports exits
//! and forwards the job's file system calls, which the host serves as the job's user.
//!
//! Pure code: no I/O, no allocation. Decoding borrows from the received bytes; everything is
//! validated before a message is returned, and no input makes this crate panic.
//!
//! # Layers
//!
//! 1. The ring (`clowder-channel`): messages of at most `max_message_len` bytes (248 with the
//!    default 256-byte slots).
//! 2. Frames ([`frame`]): one byte of frame kind in front of each ring message, so a message up
//!    to [`MAX_MESSAGE_LEN`] (64 KiB) can span several ring messages. Send with
//!    [`Fragmenter`], receive with [`Reassembler`].
//! 3. Messages (this module): `u16 kind`, then the kind's fields in order. Integers are
//!    little-endian; `bytes` is a u32 length and that many bytes; a `cstr` is `bytes` without
//!    NUL (argv, env, paths, names; paths and names must also be non-empty); a `list<T>` is a
//!    u32 count and the items. A message must be consumed exactly: trailing bytes are an error.
//!
//! # Host → enclave ([`HostMessage`])
//!
//! | kind | message | fields |
//! |------|---------|--------|
//! | `0x0001` | `Ping` | u64 nonce: answer `Pong` with the same nonce |
//! | `0x0002` | `LaunchJob` | u32 job, `list<cstr>` argv, `list<cstr>` env, cstr cwd, u64 cores, u64 heap_size, u64 stack_size, `file` binary, `list<file>` files, u64 pid: the launching client's host pid, which an LWK gives the job's first process where no process of the enclave has it (0: the kernel picks one) |
//! | `0x0003` | `SignalJob` | u32 job, u32 signal (Linux numbers) |
//! | `0x0004` | `KillJob` | u32 job |
//! | `0x0005` | `Shutdown` | (none): end every job, then stop the machine |
//! | `0x0006` | `FileResult` | u32 job, u32 request, i64 result (≥ 0 as the call returns, < 0 a negated Linux errno) |
//! | `0x0007` | `FileAttributes` | u32 job, u32 request, [`FileAttributes`]: the successful answer to `Fstat`/`Stat` |
//! | `0x0008` | `Xemem` | bytes message: one XEMEM protocol message (below) |
//! | `0x0009` | `MemoryZeroed` | u32 request, i32 result (0, or a negated Linux errno: `EFAULT` for a range outside the enclave's RAM or touching the channel, `EINVAL` for an unaligned one) |
//! | `0x000a` | `SocketResult` | u32 job, u32 request, i64 result, u32 events, bytes data: the answer to a `SocketRequest` ([`socket`]) |
//! | `0x000b` | `SocketReady` | u32 job, u32 handle, u32 events: a socket's readiness changed on the host ([`socket`]) |
//! | `0x000c` | `SharedFileTruncated` | u64 gpa, u64 len: guest-physical `[gpa, gpa + len)`, the tail of a region `MapShared` made, lies past its file's new end (the file was truncated on the host): the kernel unmaps those pages from every mapping of the region, so a touch there is `SIGBUS` as on Linux (the VMM gives them zero pages meanwhile, so a touch racing this message reads zeros and never hangs) |
//!
//! `file` is `cstr name, u64 gpa, u64 len`: a file the host placed in enclave memory at
//! guest-physical `[gpa, gpa + len)`, to appear read-only under `name` in the kernel's in-memory
//! file system. `cores` is a mask of the enclave's vCPU indices the job may run on (0: all of
//! them); `heap_size` and `stack_size` of 0 mean the kernel's defaults. `cwd` is the job's
//! working directory as a host path: `getcwd` returns it, and the host resolves the relative
//! paths of `FileRequest`s from it.
//!
//! # Enclave → host ([`EnclaveMessage`])
//!
//! | kind | message | fields |
//! |------|---------|--------|
//! | `0x8001` | `Hello` | u16 version ([`PROTOCOL_VERSION`]), u16 vcpus, u64 memory bytes: the kernel is ready; sent once, first |
//! | `0x8002` | `Pong` | u64 nonce |
//! | `0x8003` | `JobStarted` | u32 job |
//! | `0x8004` | `JobOutput` | u32 job, u8 stream (1 stdout, 2 stderr), bytes data |
//! | `0x8005` | `JobExited` | u32 job, u32 status: the exit code (0..=255), or [`KILLED_BY_SIGNAL`] + N when signal N killed the job ([`job_status_signal`]) |
//! | `0x8006` | `LaunchFailed` | u32 job, i32 errno (positive), bytes reason |
//! | `0x8007` | `Log` | bytes text: a kernel log line |
//! | `0x8008` | `Panic` | bytes text: the kernel is going down |
//! | `0x8009` | `FileRequest` | u32 job, u32 request, u8 op, op fields (below) |
//! | `0x800a` | `Xemem` | bytes message: one XEMEM protocol message (below) |
//! | `0x800b` | `ZeroMemory` | u32 request, u64 gpa, u64 len: the host clears guest-physical `[gpa, gpa + len)` (page aligned, in RAM) and answers `MemoryZeroed`; the kernel gives a finished job's memory back this way, as clearing it in guest kernel code may be slow (emulated on PVM) |
//! | `0x800c` | `MappingCounter` | u64 gpa: where the kernel keeps its count of page-table changes (an 8-byte aligned u64 in RAM, bumped before any user mapping is made or taken away); sent once after `Hello`. The host may reuse frames the kernel resolved for XEMEM while the count has not moved |
//! | `0x800d` | `FileSlots` | u64 gpa, u16 count: where the kernel's request slots for file calls are ([`slots`]: a control page, then `count` slot pages, page aligned, in RAM); sent once after `Hello`. From then on the kernel may post a `FileRequest` in its CPU's slot instead of sending it, and the host answers it there (or, when it serves no slots, never says `HOST_READY` and every request stays on the channel) |
//! | `0x800e` | `SocketRequest` | u32 job, u32 request, u8 op, op fields: a forwarded socket call ([`socket`]) |
//!
//! `JobOutput` data should fit one ring message (see [`max_output_chunk`]) so output streams
//! as it is written; it is not an error to send more.
//!
//! # Forwarded file calls (`FileRequest`)
//!
//! `request` is chosen by the kernel and echoed in the reply; requests of one job are answered
//! in order. `handle` is the host's number for an open file (the `Open` result), not the job's
//! descriptor. Data never travels in messages: `gpa, len` name the job's buffer in enclave
//! memory (guest-physical, one contiguous run; split a buffer that spans runs), and the host
//! reads or writes it there directly.
//!
//! | op | call | fields | result |
//! |----|------|--------|--------|
//! | 1 | `Open` | cstr path, u32 flags (Linux `O_*`), u32 mode | handle |
//! | 2 | `Close` | u32 handle | 0 |
//! | 3 | `Read` | u32 handle, u64 gpa, u32 len | bytes read |
//! | 4 | `Write` | u32 handle, u64 gpa, u32 len | bytes written |
//! | 5 | `Pread` | u32 handle, u64 gpa, u32 len, u64 offset | bytes read |
//! | 6 | `Pwrite` | u32 handle, u64 gpa, u32 len, u64 offset | bytes written |
//! | 7 | `Lseek` | u32 handle, i64 offset, u32 whence | new offset |
//! | 8 | `Fstat` | u32 handle | `FileAttributes` |
//! | 9 | `Stat` | cstr path | `FileAttributes` |
//! | 10 | `Unlink` | cstr path | 0 |
//! | 11 | `Mkdir` | cstr path, u32 mode | 0 |
//! | 12 | `Ftruncate` | u32 handle, u64 length | 0 |
//! | 13 | `Getdents` | u32 handle, u64 gpa, u32 len | bytes of Linux `linux_dirent64` records written |
//! | 14 | `MapShared` | u32 handle, u64 offset, u64 len, u8 writable | the guest-physical address where `[offset, offset + len)` of the file now shows (a region the host added: `mmap(MAP_SHARED)` of a host file, whose pages the kernel maps into the process, shared with every other mapping of the file) |
//! | 15 | `UnmapShared` | u64 gpa | 0: the region `MapShared` made at `gpa` is gone (the host removes a job's remaining ones when it ends) |
//! | 16 | `Statfs` | cstr path, u64 gpa | 0: the host wrote Linux's x86-64 `struct statfs` ([`STATFS_LEN`] bytes) of the path's file system at `gpa` |
//! | 17 | `Fstatfs` | u32 handle, u64 gpa | 0: as `Statfs`, for an open file |
//! | 18 | `Rename` | cstr from, cstr to | 0 |
//! | 19 | `Rmdir` | cstr path | 0 |
//!
//! Paths are the host's, relative to the job's working directory or absolute, and are served
//! with the rights of the job's user (uid, gid, supplementary groups): the host's own checks
//! answer (`-EACCES`, `-ENOENT`, ...). Unknown handles are `-EBADF`.
//!
//! A job confined to a directory (clowderd's `confine`) may name only paths beneath it: the
//! host refuses anything else (`..` leaving it, other absolute paths, symbolic links out of it)
//! with `-EACCES`. [`SYSTEM_PATHS`] (the dynamic loader's cache, interpreter and libraries)
//! are served to it all the same, read-only (`-EROFS` for anything that would change them),
//! with the job's user's rights: a dynamically linked program starts anywhere.
//!
//! # XEMEM on the channel (`Xemem`)
//!
//! The channel is one XEMEM link between the enclave's `xemem::node::Node` and the host's (the
//! name server lives in `clowderd`). `Xemem` carries one encoded `xemem::wire::Message` as it
//! is, in either direction: this crate only checks that it is non-empty (the frame layer
//! bounds it by [`MAX_MESSAGE_LEN`]); the receiver decodes it with `xemem`'s strict decoder
//! and drops (and logs) what does not decode. Carried opaquely rather than as messages of
//! this protocol, so the routing engine, its retries and its validation stay in one crate,
//! shared with every other kind of link (a second daemon, another enclave), and this crate
//! needs no knowledge of XEMEM.
//!
//! # Session
//!
//! After boot the kernel attaches the channel and sends `Hello`. The host answers nothing to it
//! but starts pinging; a kernel that does not answer `Ping` in time is declared hung and its
//! enclave is torn down. `LaunchJob` → `JobStarted` (or `LaunchFailed`) → any number of
//! `JobOutput` and `FileRequest`/reply pairs → `JobExited`.
//!
//! # The guest side, step by step
//!
//! 1. Find the channel on the command line (`clowder.channel=<gpa>,<size>`,
//!    `clowder.channel_vector=<v>`, `clowder.channel_port=<p>`; `docs/guest-abi.md`), map it,
//!    `clowder_channel::Channel::attach` it and take `guest_end()`. Keep one frame buffer of
//!    `max_message_len()` bytes and one [`Reassembler`] over a [`MAX_MESSAGE_LEN`] buffer.
//! 2. Enable the LAPIC and route `channel_vector` to a handler on vCPU 0.
//! 3. Send `Hello { version: PROTOCOL_VERSION, vcpus, memory }`.
//! 4. Receive: `recv` frames, push them through the reassembler, [`HostMessage::decode`] the
//!    result. Send: [`EnclaveMessage::encode`], cut with [`Fragmenter`], `send` each frame
//!    (retry while the ring is full), then write the doorbell port if `peer_waiting()`.
//! 5. **Keep `waiting` set whenever the kernel is not polling the ring, including while a job
//!    runs**, so each host message raises the channel interrupt. A tickless kernel whose job
//!    spins in user space never looks at the ring otherwise, and an unanswered `Ping` (5 s by
//!    default) gets the enclave removed. Answering `Ping` from the interrupt handler is enough.
//! 6. On `LaunchJob`: map the `binary` and `files` runs (they are memory regions the host added
//!    above RAM, not in the boot memory map), load the binary, give the job `argv`, `env` and
//!    `cwd`, send `JobStarted`; stream writes to fds 1 and 2 as `JobOutput` (chunks of
//!    [`max_output_chunk`]); forward file calls on other paths as `FileRequest` (on the channel,
//!    or in a file slot: [`slots`]) and block the calling thread until the reply with the same
//!    `request` arrives; send `JobExited` last.
//! 7. On `Shutdown`: end the jobs, then stop the machine (write the exit port).

pub mod frame;
pub mod slots;
pub mod socket;
mod wire;

#[cfg(test)]
extern crate std;
#[cfg(test)]
mod tests;

pub use frame::{
    Fragmenter, FrameError, Reassembler, FRAME_CONTINUATION, FRAME_START, FRAME_WHOLE, MAX_MESSAGE_LEN, MIN_FRAME_LEN, START_OVERHEAD,
};
pub use socket::{Run, SocketOp};
pub use wire::{DecodeError, EncodeError, Item, List, ListIter, Reader, Writer};

/// Bumped on any incompatible change; the kernel reports its version in `Hello`. 3: a job
/// killed by a signal is reported as [`KILLED_BY_SIGNAL`] + N, no longer as 128 + N, which
/// could not be told from `exit(128 + N)`.
pub const PROTOCOL_VERSION: u16 = 3;

/// `JobExited`'s status for a job killed by signal N is this + N: above every exit code.
pub const KILLED_BY_SIGNAL: u32 = 0x100;

/// The signal a `JobExited` status says killed the job; `None` for an exit code.
pub fn job_status_signal(status: u32) -> Option<u32> {
    status.checked_sub(KILLED_BY_SIGNAL).filter(|&signal| (1..KILLED_BY_SIGNAL).contains(&signal))
}

/// Bytes in front of `JobOutput` data: frame byte, kind, job, stream, data length.
pub const OUTPUT_OVERHEAD: usize = 1 + 2 + 4 + 1 + 4;

/// The most output data that still fits one ring message of `max_frame_len` bytes.
pub fn max_output_chunk(max_frame_len: usize) -> usize {
    max_frame_len.saturating_sub(OUTPUT_OVERHEAD)
}

pub mod kind {
    pub const PING: u16 = 0x0001;
    pub const LAUNCH_JOB: u16 = 0x0002;
    pub const SIGNAL_JOB: u16 = 0x0003;
    pub const KILL_JOB: u16 = 0x0004;
    pub const SHUTDOWN: u16 = 0x0005;
    pub const FILE_RESULT: u16 = 0x0006;
    pub const FILE_ATTRIBUTES: u16 = 0x0007;
    pub const XEMEM_TO_ENCLAVE: u16 = 0x0008;
    pub const MEMORY_ZEROED: u16 = 0x0009;
    pub const SOCKET_RESULT: u16 = 0x000a;
    pub const SOCKET_READY: u16 = 0x000b;
    pub const SHARED_FILE_TRUNCATED: u16 = 0x000c;

    pub const HELLO: u16 = 0x8001;
    pub const PONG: u16 = 0x8002;
    pub const JOB_STARTED: u16 = 0x8003;
    pub const JOB_OUTPUT: u16 = 0x8004;
    pub const JOB_EXITED: u16 = 0x8005;
    pub const LAUNCH_FAILED: u16 = 0x8006;
    pub const LOG: u16 = 0x8007;
    pub const PANIC: u16 = 0x8008;
    pub const FILE_REQUEST: u16 = 0x8009;
    pub const XEMEM_TO_HOST: u16 = 0x800a;
    pub const ZERO_MEMORY: u16 = 0x800b;
    pub const MAPPING_COUNTER: u16 = 0x800c;
    pub const FILE_SLOTS: u16 = 0x800d;
    pub const SOCKET_REQUEST: u16 = 0x800e;
}

/// A file the host placed in enclave memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileImage<'a> {
    pub name: &'a [u8],
    pub gpa: u64,
    pub len: u64,
}

impl<'a> Item<'a> for FileImage<'a> {
    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.name(self.name, "file.name")?;
        writer.u64(self.gpa)?;
        writer.u64(self.len)
    }
    fn read(reader: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(FileImage { name: reader.name("file.name")?, gpa: reader.u64("file.gpa")?, len: reader.u64("file.len")? })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchJob<'a> {
    pub job: u32,
    pub argv: List<'a, &'a [u8]>,
    pub env: List<'a, &'a [u8]>,
    pub cwd: &'a [u8],
    pub cores: u64,
    pub heap_size: u64,
    pub stack_size: u64,
    pub binary: FileImage<'a>,
    pub files: List<'a, FileImage<'a>>,
    /// The launching client's host pid (0: none). The job's ranks then have pids that differ
    /// between enclaves and from host processes, and that name a live host process for as
    /// long as the job runs (`/proc/PID/stat`), as MPI libraries expect of a peer's pid.
    pub pid: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanoseconds: u32,
}

/// What `stat` tells, in Linux's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FileAttributes {
    pub mode: u32,
    pub size: u64,
    pub inode: u64,
    pub links: u64,
    pub uid: u32,
    pub gid: u32,
    pub block_size: u32,
    pub blocks: u64,
    pub accessed: Timestamp,
    pub modified: Timestamp,
    pub changed: Timestamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMessage<'a> {
    Ping {
        nonce: u64,
    },
    LaunchJob(LaunchJob<'a>),
    SignalJob {
        job: u32,
        signal: u32,
    },
    KillJob {
        job: u32,
    },
    Shutdown,
    FileResult {
        job: u32,
        request: u32,
        result: i64,
    },
    FileAttributes {
        job: u32,
        request: u32,
        attributes: FileAttributes,
    },
    /// One XEMEM message (an encoded `xemem::wire::Message`) for the enclave's node.
    Xemem {
        message: &'a [u8],
    },
    MemoryZeroed {
        request: u32,
        result: i32,
    },
    SocketResult {
        job: u32,
        request: u32,
        result: i64,
        events: u32,
        data: &'a [u8],
    },
    SocketReady {
        job: u32,
        handle: u32,
        events: u32,
    },
    SharedFileTruncated {
        gpa: u64,
        len: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout = 1,
    Stderr = 2,
}

/// The host's files every job may read, whatever its directory: these files and everything
/// under these directories (absolute paths without `.` or `..` components).
pub const SYSTEM_PATHS: &[&str] = &["/etc/ld.so.cache", "/lib", "/lib64", "/usr/lib", "/usr/lib64"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOp<'a> {
    Open {
        path: &'a [u8],
        flags: u32,
        mode: u32,
    },
    Close {
        handle: u32,
    },
    Read {
        handle: u32,
        gpa: u64,
        len: u32,
    },
    Write {
        handle: u32,
        gpa: u64,
        len: u32,
    },
    Pread {
        handle: u32,
        gpa: u64,
        len: u32,
        offset: u64,
    },
    Pwrite {
        handle: u32,
        gpa: u64,
        len: u32,
        offset: u64,
    },
    Lseek {
        handle: u32,
        offset: i64,
        whence: u32,
    },
    Fstat {
        handle: u32,
    },
    Stat {
        path: &'a [u8],
    },
    Unlink {
        path: &'a [u8],
    },
    Mkdir {
        path: &'a [u8],
        mode: u32,
    },
    Ftruncate {
        handle: u32,
        length: u64,
    },
    Rename {
        from: &'a [u8],
        to: &'a [u8],
    },
    Rmdir {
        path: &'a [u8],
    },
    /// The next entries of an open directory, as Linux's `getdents64` writes them.
    Getdents {
        handle: u32,
        gpa: u64,
        len: u32,
    },
    /// `[offset, offset + len)` of an open file (page multiples) as a new guest-physical
    /// region, writable or not.
    MapShared {
        handle: u32,
        offset: u64,
        len: u64,
        writable: bool,
    },
    /// The region a `MapShared` answered with `gpa` is no longer mapped.
    UnmapShared {
        gpa: u64,
    },
    /// The file system of `path`, as Linux's `struct statfs` written at `gpa`.
    Statfs {
        path: &'a [u8],
        gpa: u64,
    },
    /// The file system of an open file, as `Statfs`.
    Fstatfs {
        handle: u32,
        gpa: u64,
    },
}

/// Bytes of Linux's x86-64 `struct statfs`, which `Statfs` and `Fstatfs` write.
pub const STATFS_LEN: usize = 120;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnclaveMessage<'a> {
    Hello {
        version: u16,
        vcpus: u16,
        memory: u64,
    },
    Pong {
        nonce: u64,
    },
    JobStarted {
        job: u32,
    },
    JobOutput {
        job: u32,
        stream: Stream,
        data: &'a [u8],
    },
    JobExited {
        job: u32,
        status: u32,
    },
    LaunchFailed {
        job: u32,
        errno: i32,
        reason: &'a [u8],
    },
    Log {
        text: &'a [u8],
    },
    Panic {
        text: &'a [u8],
    },
    FileRequest {
        job: u32,
        request: u32,
        op: FileOp<'a>,
    },
    /// One XEMEM message (an encoded `xemem::wire::Message`) for the host's node.
    Xemem {
        message: &'a [u8],
    },
    ZeroMemory {
        request: u32,
        gpa: u64,
        len: u64,
    },
    MappingCounter {
        gpa: u64,
    },
    FileSlots {
        gpa: u64,
        count: u16,
    },
    SocketRequest {
        job: u32,
        request: u32,
        op: SocketOp<'a>,
    },
}

fn write_timestamp(writer: &mut Writer<'_>, time: Timestamp) -> Result<(), EncodeError> {
    writer.i64(time.seconds)?;
    writer.u32(time.nanoseconds)
}

fn read_timestamp(reader: &mut Reader<'_>, field: &'static str) -> Result<Timestamp, DecodeError> {
    Ok(Timestamp { seconds: reader.i64(field)?, nanoseconds: reader.u32(field)? })
}

impl FileAttributes {
    fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u32(self.mode)?;
        w.u64(self.size)?;
        w.u64(self.inode)?;
        w.u64(self.links)?;
        w.u32(self.uid)?;
        w.u32(self.gid)?;
        w.u32(self.block_size)?;
        w.u64(self.blocks)?;
        write_timestamp(w, self.accessed)?;
        write_timestamp(w, self.modified)?;
        write_timestamp(w, self.changed)
    }

    fn read(r: &mut Reader<'_>) -> Result<FileAttributes, DecodeError> {
        Ok(FileAttributes {
            mode: r.u32("attributes.mode")?,
            size: r.u64("attributes.size")?,
            inode: r.u64("attributes.inode")?,
            links: r.u64("attributes.links")?,
            uid: r.u32("attributes.uid")?,
            gid: r.u32("attributes.gid")?,
            block_size: r.u32("attributes.block_size")?,
            blocks: r.u64("attributes.blocks")?,
            accessed: read_timestamp(r, "attributes.accessed")?,
            modified: read_timestamp(r, "attributes.modified")?,
            changed: read_timestamp(r, "attributes.changed")?,
        })
    }
}

impl<'a> HostMessage<'a> {
    /// Encodes into `out` and returns the length used.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let mut w = Writer::new(out);
        match self {
            HostMessage::Ping { nonce } => {
                w.u16(kind::PING)?;
                w.u64(*nonce)?;
            }
            HostMessage::LaunchJob(launch) => {
                w.u16(kind::LAUNCH_JOB)?;
                w.u32(launch.job)?;
                launch.argv.write(&mut w, "argv")?;
                launch.env.write(&mut w, "env")?;
                w.name(launch.cwd, "cwd")?;
                w.u64(launch.cores)?;
                w.u64(launch.heap_size)?;
                w.u64(launch.stack_size)?;
                launch.binary.write(&mut w)?;
                launch.files.write(&mut w, "files")?;
                w.u64(launch.pid)?;
            }
            HostMessage::SignalJob { job, signal } => {
                w.u16(kind::SIGNAL_JOB)?;
                w.u32(*job)?;
                w.u32(*signal)?;
            }
            HostMessage::KillJob { job } => {
                w.u16(kind::KILL_JOB)?;
                w.u32(*job)?;
            }
            HostMessage::Shutdown => w.u16(kind::SHUTDOWN)?,
            HostMessage::FileResult { job, request, result } => {
                w.u16(kind::FILE_RESULT)?;
                w.u32(*job)?;
                w.u32(*request)?;
                w.i64(*result)?;
            }
            HostMessage::FileAttributes { job, request, attributes } => {
                w.u16(kind::FILE_ATTRIBUTES)?;
                w.u32(*job)?;
                w.u32(*request)?;
                attributes.write(&mut w)?;
            }
            HostMessage::Xemem { message } => {
                w.u16(kind::XEMEM_TO_ENCLAVE)?;
                write_xemem(&mut w, message)?;
            }
            HostMessage::MemoryZeroed { request, result } => {
                w.u16(kind::MEMORY_ZEROED)?;
                w.u32(*request)?;
                w.i32(*result)?;
            }
            HostMessage::SocketResult { job, request, result, events, data } => {
                w.u16(kind::SOCKET_RESULT)?;
                w.u32(*job)?;
                w.u32(*request)?;
                w.i64(*result)?;
                w.u32(*events)?;
                w.bytes(data, "data")?;
            }
            HostMessage::SocketReady { job, handle, events } => {
                w.u16(kind::SOCKET_READY)?;
                w.u32(*job)?;
                w.u32(*handle)?;
                w.u32(*events)?;
            }
            HostMessage::SharedFileTruncated { gpa, len } => {
                w.u16(kind::SHARED_FILE_TRUNCATED)?;
                w.u64(*gpa)?;
                w.u64(*len)?;
            }
        }
        Ok(w.written())
    }

    /// Decodes one complete message (after reassembly).
    pub fn decode(bytes: &'a [u8]) -> Result<HostMessage<'a>, DecodeError> {
        let mut r = Reader::new(bytes);
        let message = match r.u16("kind")? {
            kind::PING => HostMessage::Ping { nonce: r.u64("nonce")? },
            kind::LAUNCH_JOB => HostMessage::LaunchJob(LaunchJob {
                job: r.u32("job")?,
                argv: List::read(&mut r, "argv")?,
                env: List::read(&mut r, "env")?,
                cwd: r.name("cwd")?,
                cores: r.u64("cores")?,
                heap_size: r.u64("heap_size")?,
                stack_size: r.u64("stack_size")?,
                binary: FileImage::read(&mut r)?,
                files: List::read(&mut r, "files")?,
                pid: r.u64("pid")?,
            }),
            kind::SIGNAL_JOB => HostMessage::SignalJob { job: r.u32("job")?, signal: r.u32("signal")? },
            kind::KILL_JOB => HostMessage::KillJob { job: r.u32("job")? },
            kind::SHUTDOWN => HostMessage::Shutdown,
            kind::FILE_RESULT => HostMessage::FileResult { job: r.u32("job")?, request: r.u32("request")?, result: r.i64("result")? },
            kind::FILE_ATTRIBUTES => {
                HostMessage::FileAttributes { job: r.u32("job")?, request: r.u32("request")?, attributes: FileAttributes::read(&mut r)? }
            }
            kind::XEMEM_TO_ENCLAVE => HostMessage::Xemem { message: read_xemem(&mut r)? },
            kind::MEMORY_ZEROED => HostMessage::MemoryZeroed { request: r.u32("request")?, result: r.i32("result")? },
            kind::SOCKET_RESULT => HostMessage::SocketResult {
                job: r.u32("job")?,
                request: r.u32("request")?,
                result: r.i64("result")?,
                events: r.u32("events")?,
                data: r.bytes("data")?,
            },
            kind::SOCKET_READY => HostMessage::SocketReady { job: r.u32("job")?, handle: r.u32("handle")?, events: r.u32("events")? },
            kind::SHARED_FILE_TRUNCATED => HostMessage::SharedFileTruncated { gpa: r.u64("gpa")?, len: r.u64("len")? },
            other => return Err(DecodeError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(message)
    }
}

/// An XEMEM message must hold something (its own decoder checks the rest).
fn write_xemem(writer: &mut Writer<'_>, message: &[u8]) -> Result<(), EncodeError> {
    if message.is_empty() {
        return Err(EncodeError::Empty { field: "xemem" });
    }
    writer.bytes(message, "xemem")
}

fn read_xemem<'a>(reader: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
    let message = reader.bytes("xemem")?;
    if message.is_empty() {
        return Err(DecodeError::Empty { field: "xemem" });
    }
    Ok(message)
}

impl<'a> FileOp<'a> {
    fn code(&self) -> u8 {
        match self {
            FileOp::Open { .. } => 1,
            FileOp::Close { .. } => 2,
            FileOp::Read { .. } => 3,
            FileOp::Write { .. } => 4,
            FileOp::Pread { .. } => 5,
            FileOp::Pwrite { .. } => 6,
            FileOp::Lseek { .. } => 7,
            FileOp::Fstat { .. } => 8,
            FileOp::Stat { .. } => 9,
            FileOp::Unlink { .. } => 10,
            FileOp::Mkdir { .. } => 11,
            FileOp::Ftruncate { .. } => 12,
            FileOp::Getdents { .. } => 13,
            FileOp::MapShared { .. } => 14,
            FileOp::UnmapShared { .. } => 15,
            FileOp::Statfs { .. } => 16,
            FileOp::Fstatfs { .. } => 17,
            FileOp::Rename { .. } => 18,
            FileOp::Rmdir { .. } => 19,
        }
    }

    fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u8(self.code())?;
        match *self {
            FileOp::Open { path, flags, mode } => {
                w.name(path, "path")?;
                w.u32(flags)?;
                w.u32(mode)
            }
            FileOp::Close { handle } | FileOp::Fstat { handle } => w.u32(handle),
            FileOp::Read { handle, gpa, len } | FileOp::Write { handle, gpa, len } | FileOp::Getdents { handle, gpa, len } => {
                w.u32(handle)?;
                w.u64(gpa)?;
                w.u32(len)
            }
            FileOp::Pread { handle, gpa, len, offset } | FileOp::Pwrite { handle, gpa, len, offset } => {
                w.u32(handle)?;
                w.u64(gpa)?;
                w.u32(len)?;
                w.u64(offset)
            }
            FileOp::Lseek { handle, offset, whence } => {
                w.u32(handle)?;
                w.i64(offset)?;
                w.u32(whence)
            }
            FileOp::Stat { path } | FileOp::Unlink { path } | FileOp::Rmdir { path } => w.name(path, "path"),
            FileOp::Rename { from, to } => {
                w.name(from, "from")?;
                w.name(to, "to")
            }
            FileOp::Mkdir { path, mode } => {
                w.name(path, "path")?;
                w.u32(mode)
            }
            FileOp::Ftruncate { handle, length } => {
                w.u32(handle)?;
                w.u64(length)
            }
            FileOp::MapShared { handle, offset, len, writable } => {
                w.u32(handle)?;
                w.u64(offset)?;
                w.u64(len)?;
                w.u8(writable as u8)
            }
            FileOp::UnmapShared { gpa } => w.u64(gpa),
            FileOp::Statfs { path, gpa } => {
                w.name(path, "path")?;
                w.u64(gpa)
            }
            FileOp::Fstatfs { handle, gpa } => {
                w.u32(handle)?;
                w.u64(gpa)
            }
        }
    }

    fn read(r: &mut Reader<'a>) -> Result<FileOp<'a>, DecodeError> {
        Ok(match r.u8("op")? {
            1 => FileOp::Open { path: r.name("path")?, flags: r.u32("flags")?, mode: r.u32("mode")? },
            2 => FileOp::Close { handle: r.u32("handle")? },
            3 => FileOp::Read { handle: r.u32("handle")?, gpa: r.u64("gpa")?, len: r.u32("len")? },
            4 => FileOp::Write { handle: r.u32("handle")?, gpa: r.u64("gpa")?, len: r.u32("len")? },
            5 => FileOp::Pread { handle: r.u32("handle")?, gpa: r.u64("gpa")?, len: r.u32("len")?, offset: r.u64("offset")? },
            6 => FileOp::Pwrite { handle: r.u32("handle")?, gpa: r.u64("gpa")?, len: r.u32("len")?, offset: r.u64("offset")? },
            7 => FileOp::Lseek { handle: r.u32("handle")?, offset: r.i64("offset")?, whence: r.u32("whence")? },
            8 => FileOp::Fstat { handle: r.u32("handle")? },
            9 => FileOp::Stat { path: r.name("path")? },
            10 => FileOp::Unlink { path: r.name("path")? },
            11 => FileOp::Mkdir { path: r.name("path")?, mode: r.u32("mode")? },
            12 => FileOp::Ftruncate { handle: r.u32("handle")?, length: r.u64("length")? },
            13 => FileOp::Getdents { handle: r.u32("handle")?, gpa: r.u64("gpa")?, len: r.u32("len")? },
            14 => {
                FileOp::MapShared { handle: r.u32("handle")?, offset: r.u64("offset")?, len: r.u64("len")?, writable: r.bool("writable")? }
            }
            15 => FileOp::UnmapShared { gpa: r.u64("gpa")? },
            16 => FileOp::Statfs { path: r.name("path")?, gpa: r.u64("gpa")? },
            17 => FileOp::Fstatfs { handle: r.u32("handle")?, gpa: r.u64("gpa")? },
            18 => FileOp::Rename { from: r.name("from")?, to: r.name("to")? },
            19 => FileOp::Rmdir { path: r.name("path")? },
            other => return Err(DecodeError::UnknownFileOp(other)),
        })
    }
}

impl<'a> EnclaveMessage<'a> {
    /// Encodes into `out` and returns the length used.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let mut w = Writer::new(out);
        match *self {
            EnclaveMessage::Hello { version, vcpus, memory } => {
                w.u16(kind::HELLO)?;
                w.u16(version)?;
                w.u16(vcpus)?;
                w.u64(memory)?;
            }
            EnclaveMessage::Pong { nonce } => {
                w.u16(kind::PONG)?;
                w.u64(nonce)?;
            }
            EnclaveMessage::JobStarted { job } => {
                w.u16(kind::JOB_STARTED)?;
                w.u32(job)?;
            }
            EnclaveMessage::JobOutput { job, stream, data } => {
                w.u16(kind::JOB_OUTPUT)?;
                w.u32(job)?;
                w.u8(stream as u8)?;
                w.bytes(data, "data")?;
            }
            EnclaveMessage::JobExited { job, status } => {
                w.u16(kind::JOB_EXITED)?;
                w.u32(job)?;
                w.u32(status)?;
            }
            EnclaveMessage::LaunchFailed { job, errno, reason } => {
                w.u16(kind::LAUNCH_FAILED)?;
                w.u32(job)?;
                w.i32(errno)?;
                w.bytes(reason, "reason")?;
            }
            EnclaveMessage::Log { text } => {
                w.u16(kind::LOG)?;
                w.bytes(text, "text")?;
            }
            EnclaveMessage::Panic { text } => {
                w.u16(kind::PANIC)?;
                w.bytes(text, "text")?;
            }
            EnclaveMessage::FileRequest { job, request, op } => {
                w.u16(kind::FILE_REQUEST)?;
                w.u32(job)?;
                w.u32(request)?;
                op.write(&mut w)?;
            }
            EnclaveMessage::Xemem { message } => {
                w.u16(kind::XEMEM_TO_HOST)?;
                write_xemem(&mut w, message)?;
            }
            EnclaveMessage::ZeroMemory { request, gpa, len } => {
                w.u16(kind::ZERO_MEMORY)?;
                w.u32(request)?;
                w.u64(gpa)?;
                w.u64(len)?;
            }
            EnclaveMessage::MappingCounter { gpa } => {
                w.u16(kind::MAPPING_COUNTER)?;
                w.u64(gpa)?;
            }
            EnclaveMessage::FileSlots { gpa, count } => {
                w.u16(kind::FILE_SLOTS)?;
                w.u64(gpa)?;
                w.u16(count)?;
            }
            EnclaveMessage::SocketRequest { job, request, op } => {
                w.u16(kind::SOCKET_REQUEST)?;
                w.u32(job)?;
                w.u32(request)?;
                op.write(&mut w)?;
            }
        }
        Ok(w.written())
    }

    /// Decodes one complete message (after reassembly).
    pub fn decode(bytes: &'a [u8]) -> Result<EnclaveMessage<'a>, DecodeError> {
        let mut r = Reader::new(bytes);
        let message = match r.u16("kind")? {
            kind::HELLO => EnclaveMessage::Hello { version: r.u16("version")?, vcpus: r.u16("vcpus")?, memory: r.u64("memory")? },
            kind::PONG => EnclaveMessage::Pong { nonce: r.u64("nonce")? },
            kind::JOB_STARTED => EnclaveMessage::JobStarted { job: r.u32("job")? },
            kind::JOB_OUTPUT => EnclaveMessage::JobOutput {
                job: r.u32("job")?,
                stream: match r.u8("stream")? {
                    1 => Stream::Stdout,
                    2 => Stream::Stderr,
                    other => return Err(DecodeError::UnknownStream(other)),
                },
                data: r.bytes("data")?,
            },
            kind::JOB_EXITED => EnclaveMessage::JobExited { job: r.u32("job")?, status: r.u32("status")? },
            kind::LAUNCH_FAILED => EnclaveMessage::LaunchFailed { job: r.u32("job")?, errno: r.i32("errno")?, reason: r.bytes("reason")? },
            kind::LOG => EnclaveMessage::Log { text: r.bytes("text")? },
            kind::PANIC => EnclaveMessage::Panic { text: r.bytes("text")? },
            kind::FILE_REQUEST => EnclaveMessage::FileRequest { job: r.u32("job")?, request: r.u32("request")?, op: FileOp::read(&mut r)? },
            kind::XEMEM_TO_HOST => EnclaveMessage::Xemem { message: read_xemem(&mut r)? },
            kind::ZERO_MEMORY => EnclaveMessage::ZeroMemory { request: r.u32("request")?, gpa: r.u64("gpa")?, len: r.u64("len")? },
            kind::MAPPING_COUNTER => EnclaveMessage::MappingCounter { gpa: r.u64("gpa")? },
            kind::FILE_SLOTS => EnclaveMessage::FileSlots { gpa: r.u64("gpa")?, count: r.u16("count")? },
            kind::SOCKET_REQUEST => {
                EnclaveMessage::SocketRequest { job: r.u32("job")?, request: r.u32("request")?, op: SocketOp::read(&mut r)? }
            }
            other => return Err(DecodeError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(message)
    }
}
