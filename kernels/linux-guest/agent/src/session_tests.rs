//! The agent's session against a fake host: a real channel over an anonymous mapping, its host
//! end driven by the test, and "guest-physical memory" that is a table of files.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use clowder_channel::Endpoint;
use enclave_proto::{
    EnclaveMessage, FileImage, Fragmenter, HostMessage, LaunchJob, List, Reassembler, Stream, MAX_MESSAGE_LEN, PROTOCOL_VERSION,
};

use super::*;

const SIZE: usize = 64 << 10;

/// Files at guest-physical addresses, and the file window a [`FileHost`] writes.
struct FakeMemory(HashMap<u64, Vec<u8>>, std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

/// Reads from here take seconds.
const SLOW_GPA: u64 = 0x50_0000;

const WINDOW: FileWindow = FileWindow { gpa: 0x7000_0000, size: 256 << 10 };

impl PhysicalMemory for FakeMemory {
    fn read(&self, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
        if gpa == SLOW_GPA {
            // Memory as slow to copy out as a large binary on a loaded PVM host.
            std::thread::sleep(Duration::from_secs(3));
        }
        if gpa == WINDOW.gpa && len <= WINDOW.size as u64 {
            return Ok(self.1.lock().unwrap()[..len as usize].to_vec());
        }
        self.0.get(&gpa).filter(|data| data.len() as u64 == len).cloned().ok_or(format!("nothing at {gpa:#x}+{len:#x}"))
    }

    fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String> {
        if gpa != WINDOW.gpa || data.len() > WINDOW.size as usize {
            return Err(format!("{gpa:#x} is not the file window"));
        }
        self.1.lock().unwrap()[..data.len()].copy_from_slice(data);
        Ok(())
    }
}

struct Host {
    base: *mut u8,
    end: Endpoint,
    frame: Vec<u8>,
    directory: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        // SAFETY: mapped by `start` with this size; the endpoints are not used after the test.
        unsafe { libc::munmap(self.base.cast(), SIZE) };
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

fn start(label: &str, files: &[(u64, Vec<u8>)]) -> (Host, Session<FakeMemory>) {
    let (host, session, _) = start_with(label, files, None);
    (host, session)
}

/// [`start`], with the file window `window` (host files) if given; the window's bytes.
fn start_with(
    label: &str,
    files: &[(u64, Vec<u8>)],
    window: Option<FileWindow>,
) -> (Host, Session<FakeMemory>, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    let shared = std::sync::Arc::new(std::sync::Mutex::new(vec![0; WINDOW.size as usize]));
    let memory = FakeMemory(files.iter().cloned().collect(), shared.clone());
    let (host, session) = start_on(label, memory, window);
    (host, session, shared)
}

/// A session on `memory` and the host's end of its channel.
fn start_on<M: PhysicalMemory + Send + Sync + 'static>(label: &str, memory: M, window: Option<FileWindow>) -> (Host, Session<M>) {
    // SAFETY: a fresh anonymous mapping, checked below.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(base, libc::MAP_FAILED);
    let base = base.cast::<u8>();
    // SAFETY: the mapping is page aligned, SIZE bytes, and outlives both endpoints (Host owns it).
    let channel = unsafe { Channel::init(base, SIZE) }.unwrap();
    let directory = std::env::temp_dir().join(format!("clowder-agent-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let session = Session::new(channel.guest_end().unwrap(), memory, job::Settings { root: directory.join("run") }, window);
    let end = channel.host_end().unwrap();
    let frame = vec![0; end.max_message_len()];
    (Host { base, end, frame, directory }, session)
}

impl Host {
    fn send(&mut self, message: &HostMessage<'_>) {
        let mut encoded = vec![0; MAX_MESSAGE_LEN];
        let length = message.encode(&mut encoded).unwrap();
        let mut fragmenter = Fragmenter::new(&encoded[..length], self.frame.len()).unwrap();
        while let Some(n) = fragmenter.next_frame(&mut self.frame) {
            self.end.send(&self.frame[..n]).unwrap();
        }
    }

    /// Polls the session until the agent has sent a message satisfying `done`; every message
    /// received on the way, in order.
    fn until<M: PhysicalMemory + Send + Sync + 'static>(
        &mut self,
        session: &mut Session<M>,
        done: impl Fn(&EnclaveMessage<'_>) -> bool,
    ) -> Vec<Vec<u8>> {
        self.serving(session, None::<&mut FileHost>, Duration::from_secs(20), done)
    }

    /// [`Host::until`], answering the agent's file calls from `files` on the way (they are
    /// not among the messages returned).
    fn serving<M: PhysicalMemory + Send + Sync + 'static>(
        &mut self,
        session: &mut Session<M>,
        mut files: Option<&mut impl ServeFiles>,
        limit: Duration,
        done: impl Fn(&EnclaveMessage<'_>) -> bool,
    ) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + limit;
        let mut assembly = vec![0; MAX_MESSAGE_LEN];
        let mut reassembler = Reassembler::new(&mut assembly);
        let mut received = Vec::new();
        loop {
            assert!(Instant::now() < deadline, "the agent did not answer in time; got {:?}", decoded(&received));
            session.poll().unwrap();
            while let Some(n) = self.end.recv(&mut self.frame).unwrap() {
                if let Some(message) = reassembler.push(&self.frame[..n]).unwrap() {
                    let owned = message.to_vec();
                    if let (Some(files), EnclaveMessage::FileRequest { job, request, op }) =
                        (files.as_deref_mut(), EnclaveMessage::decode(&owned).unwrap())
                    {
                        let reply = files.serve(job, request, &op);
                        self.send(&reply);
                        continue;
                    }
                    let finished = done(&EnclaveMessage::decode(&owned).unwrap());
                    received.push(owned);
                    if finished {
                        return received;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn decoded(messages: &[Vec<u8>]) -> Vec<EnclaveMessage<'_>> {
    messages.iter().map(|m| EnclaveMessage::decode(m).unwrap()).collect()
}

fn output(messages: &[EnclaveMessage<'_>], wanted: Stream) -> String {
    let mut text = Vec::new();
    for message in messages {
        if let EnclaveMessage::JobOutput { stream, data, .. } = message {
            if *stream == wanted {
                text.extend_from_slice(data);
            }
        }
    }
    String::from_utf8(text).unwrap()
}

fn launch<'a>(job: u32, argv: &'a [&'a [u8]], cwd: &'a [u8], binary: FileImage<'a>, files: &'a [FileImage<'a>]) -> HostMessage<'a> {
    HostMessage::LaunchJob(LaunchJob {
        job,
        argv: List::new(argv),
        env: List::new(&[b"GREETING=hi"]),
        cwd,
        cores: 0,
        heap_size: 0,
        stack_size: 0,
        binary,
        files: List::new(files),
        pid: 0,
    })
}

#[test]
fn hello_goes_first_and_pings_are_answered() {
    let (mut host, mut session) = start("ping", &[]);
    session.hello(2, 512 << 20).unwrap();
    host.send(&HostMessage::Ping { nonce: 77 });
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::Pong { .. }));
    assert_eq!(
        decoded(&got),
        [EnclaveMessage::Hello { version: PROTOCOL_VERSION, vcpus: 2, memory: 512 << 20 }, EnclaveMessage::Pong { nonce: 77 }]
    );
}

#[test]
fn a_job_gets_its_files_streams_its_output_and_reports_its_status() {
    let shell = std::fs::read("/bin/sh").unwrap();
    let (mut host, mut session) = start("job", &[(0x10_0000, shell.clone()), (0x20_0000, b"from the host\n".to_vec())]);
    let cwd = host.directory.join("work");
    let cwd = cwd.to_str().unwrap().as_bytes().to_vec();
    let argv: [&[u8]; 3] = [b"sh", b"-c", b"cat in.txt; echo $GREETING $0; echo oops >&2; exit 3"];
    let binary = FileImage { name: b"/bin/sh", gpa: 0x10_0000, len: shell.len() as u64 };
    let files = [FileImage { name: b"in.txt", gpa: 0x20_0000, len: 14 }];
    host.send(&launch(5, &argv, &cwd, binary, &files));
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::JobExited { .. }));
    let messages = decoded(&got);
    assert_eq!(messages.first(), Some(&EnclaveMessage::JobStarted { job: 5 }));
    assert_eq!(messages.last(), Some(&EnclaveMessage::JobExited { job: 5, status: 3 }));
    assert_eq!(output(&messages, Stream::Stdout), "from the host\nhi sh\n");
    assert_eq!(output(&messages, Stream::Stderr), "oops\n");
    assert_eq!(session.running_jobs(), 0);
    assert!(!host.directory.join("run/job-5").exists(), "the job's binary is removed when it ends");
}

#[test]
fn a_killed_job_reports_the_signal_and_a_bad_binary_fails_to_launch() {
    let shell = std::fs::read("/bin/sh").unwrap();
    let (mut host, mut session) = start("kill", &[(0x10_0000, shell.clone()), (0x30_0000, b"not a program".to_vec())]);
    let cwd = host.directory.to_str().unwrap().as_bytes().to_vec();
    let argv: [&[u8]; 3] = [b"sh", b"-c", b"echo up; exec sleep 30"];
    host.send(&launch(1, &argv, &cwd, FileImage { name: b"sh", gpa: 0x10_0000, len: shell.len() as u64 }, &[]));
    host.until(&mut session, |m| matches!(m, EnclaveMessage::JobOutput { .. }));
    host.send(&HostMessage::KillJob { job: 1 });
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::JobExited { .. }));
    assert_eq!(decoded(&got).last(), Some(&EnclaveMessage::JobExited { job: 1, status: enclave_proto::KILLED_BY_SIGNAL + 9 }));

    let argv: [&[u8]; 1] = [b"junk"];
    host.send(&launch(2, &argv, &cwd, FileImage { name: b"junk", gpa: 0x30_0000, len: 13 }, &[]));
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::LaunchFailed { .. }));
    match decoded(&got).last() {
        Some(EnclaveMessage::LaunchFailed { job: 2, errno, reason }) => {
            assert_eq!(*errno, libc::ENOEXEC, "{}", String::from_utf8_lossy(reason));
        }
        other => panic!("expected LaunchFailed, got {other:?}"),
    }
}

/// A job whose binary takes long to copy out does not hold up the session: a Ping meanwhile is
/// answered at once (the daemon judges an enclave hung by its Pongs).
#[test]
fn pings_are_answered_while_a_slow_binary_is_placed() {
    let shell = std::fs::read("/bin/sh").unwrap();
    let (mut host, mut session) = start("slow", &[(SLOW_GPA, shell.clone())]);
    let cwd = host.directory.to_str().unwrap().as_bytes().to_vec();
    let argv: [&[u8]; 3] = [b"sh", b"-c", b"exit 4"];
    host.send(&launch(6, &argv, &cwd, FileImage { name: b"/bin/sh", gpa: SLOW_GPA, len: shell.len() as u64 }, &[]));
    host.send(&HostMessage::Ping { nonce: 5 });
    let asked = Instant::now();
    host.until(&mut session, |m| matches!(m, EnclaveMessage::Pong { nonce: 5 }));
    assert!(asked.elapsed() < Duration::from_secs(2), "the Pong took {:?}", asked.elapsed());
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::JobExited { .. }));
    assert_eq!(decoded(&got).last(), Some(&EnclaveMessage::JobExited { job: 6, status: 4 }));
}

/// A kill that comes while the job's files are still being copied ends the job: its process
/// never runs, and the host hears it ended by SIGKILL.
#[test]
fn a_job_killed_while_its_binary_is_placed_never_runs() {
    let shell = std::fs::read("/bin/sh").unwrap();
    let (mut host, mut session) = start("kill-early", &[(SLOW_GPA, shell.clone())]);
    let marker = host.directory.join("ran");
    let cwd = host.directory.to_str().unwrap().as_bytes().to_vec();
    let argv: [&[u8]; 3] = [b"sh", b"-c", b"echo ran > ran"];
    host.send(&launch(7, &argv, &cwd, FileImage { name: b"/bin/sh", gpa: SLOW_GPA, len: shell.len() as u64 }, &[]));
    host.send(&HostMessage::Ping { nonce: 1 });
    host.until(&mut session, |m| matches!(m, EnclaveMessage::Pong { .. }));
    host.send(&HostMessage::KillJob { job: 7 });
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::JobExited { .. } | EnclaveMessage::LaunchFailed { .. }));
    assert_eq!(decoded(&got), [EnclaveMessage::JobExited { job: 7, status: enclave_proto::KILLED_BY_SIGNAL + 9 }]);
    assert_eq!(session.running_jobs(), 0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "the killed job's process ran");
    assert!(!host.directory.join("run/job-7").exists(), "its binary is removed");
}

#[test]
fn garbage_from_the_host_is_logged_and_the_session_goes_on() {
    let (mut host, mut session) = start("garbage", &[]);
    // A frame whose kind byte is unknown, then a whole frame holding an unknown message kind.
    host.end.send(&[0xee, 1, 2, 3]).unwrap();
    host.end.send(&[enclave_proto::FRAME_WHOLE, 0x77, 0x77]).unwrap();
    host.send(&HostMessage::Ping { nonce: 9 });
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::Pong { .. }));
    let messages = decoded(&got);
    let logs = messages.iter().filter(|m| matches!(m, EnclaveMessage::Log { text } if text.starts_with(b"agent: malformed"))).count();
    assert_eq!(logs, 2, "{messages:?}");
    assert_eq!(messages.last(), Some(&EnclaveMessage::Pong { nonce: 9 }));
}

#[test]
fn a_missing_file_region_fails_the_launch() {
    let (mut host, mut session) = start("missing", &[]);
    let cwd = host.directory.to_str().unwrap().as_bytes().to_vec();
    let argv: [&[u8]; 1] = [b"x"];
    host.send(&launch(3, &argv, &cwd, FileImage { name: b"x", gpa: 0x40_0000, len: 100 }, &[]));
    let got = host.until(&mut session, |m| matches!(m, EnclaveMessage::LaunchFailed { .. }));
    assert!(matches!(decoded(&got).last(), Some(EnclaveMessage::LaunchFailed { job: 3, errno, .. }) if *errno == libc::EFAULT));
}

/// Answers from the host that do not fit the file call fail it with EIO, logged with what was
/// wrong, instead of reaching the job's FUSE mount: a read answered with more bytes than it
/// asked, an errno FUSE cannot carry, and an answer to a call not asked (ignored; the call
/// gets its own answer after it).
#[test]
fn wrong_answers_to_file_calls_fail_them_clearly() {
    use crate::host_files::{FileAnswer, FileCall};
    let (mut host, mut session, _) = start_with("wrong-answers", &[], Some(WINDOW));
    let forwarder = session.forwarder().unwrap();
    let calls = std::thread::spawn(move || {
        let stat = || FileCall::Stat { path: b"/etc/hostname".to_vec() };
        [forwarder.call(4, FileCall::Pread { handle: 3, len: 100, offset: 0 }), forwarder.call(4, stat()), forwarder.call(4, stat())]
    });
    let mut answers: Vec<i64> = vec![4096, -100_000, -(libc::ENOENT as i64)];
    answers.reverse();
    let (mut assembly, mut logs) = (vec![0; MAX_MESSAGE_LEN], Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !calls.is_finished() {
        assert!(Instant::now() < deadline, "the calls were not answered; logs: {logs:?}");
        session.poll().unwrap();
        let mut reassembler = Reassembler::new(&mut assembly);
        let mut replies = Vec::new();
        while let Some(n) = host.end.recv(&mut host.frame).unwrap() {
            match reassembler.push(&host.frame[..n]).unwrap().map(|m| EnclaveMessage::decode(m).unwrap()) {
                Some(EnclaveMessage::FileRequest { job, request, .. }) => {
                    let result = answers.pop().unwrap();
                    if answers.is_empty() {
                        // First an answer to a request the agent did not make.
                        replies.push(HostMessage::FileResult { job, request: request + 1000, result: 0 });
                    }
                    replies.push(HostMessage::FileResult { job, request, result });
                }
                Some(EnclaveMessage::Log { text }) => logs.push(String::from_utf8_lossy(text).into_owned()),
                _ => {}
            }
        }
        for reply in replies {
            host.send(&reply);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = calls.join().unwrap();
    assert_eq!(got, [FileAnswer::Error(libc::EIO), FileAnswer::Error(libc::EIO), FileAnswer::Error(libc::ENOENT)]);
    session.poll().unwrap();
    while let Some(n) = host.end.recv(&mut host.frame).unwrap() {
        if let Some(EnclaveMessage::Log { text }) =
            Reassembler::new(&mut assembly).push(&host.frame[..n]).unwrap().map(|m| EnclaveMessage::decode(m).unwrap())
        {
            logs.push(String::from_utf8_lossy(text).into_owned());
        }
    }
    let said = |wanted: &str| logs.iter().any(|line| line.contains(wanted));
    assert!(said("the host answered 4096 bytes where at most 100 were asked; failed with EIO"), "{logs:?}");
    assert!(said("the host answered -100000, which is no errno; failed with EIO"), "{logs:?}");
    assert!(said("which was not asked; ignored"), "{logs:?}");
}

/// A fake host that serves the agent's forwarded file calls from this machine's own files,
/// as the daemon's hio.rs does (without its user and confinement checks), writing what a
/// call reads into the window `memory` shares with the session.
struct FileHost {
    window: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    open: HashMap<u32, std::fs::File>,
    next: u32,
    served: usize,
}

/// What answers the agent's forwarded file calls in these tests.
trait ServeFiles {
    fn serve(&mut self, job: u32, request: u32, op: &enclave_proto::FileOp<'_>) -> HostMessage<'static>;
}

impl ServeFiles for FileHost {
    fn serve(&mut self, job: u32, request: u32, op: &enclave_proto::FileOp<'_>) -> HostMessage<'static> {
        self.served += 1;
        use enclave_proto::{FileAttributes, FileOp, Timestamp};
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        let path = |p: &[u8]| PathBuf::from(std::ffi::OsStr::from_bytes(p));
        let errno = |e: std::io::Error| -(e.raw_os_error().unwrap_or(libc::EIO) as i64);
        let result = match op {
            FileOp::Stat { path: p } => match std::fs::metadata(path(p)) {
                Ok(m) => {
                    let time = |seconds, nanoseconds: i64| Timestamp { seconds, nanoseconds: nanoseconds as u32 };
                    let attributes = FileAttributes {
                        mode: m.mode(),
                        size: m.size(),
                        inode: m.ino(),
                        links: m.nlink(),
                        uid: m.uid(),
                        gid: m.gid(),
                        block_size: m.blksize() as u32,
                        blocks: m.blocks(),
                        accessed: time(m.atime(), m.atime_nsec()),
                        modified: time(m.mtime(), m.mtime_nsec()),
                        changed: time(m.ctime(), m.ctime_nsec()),
                    };
                    return HostMessage::FileAttributes { job, request, attributes };
                }
                Err(e) => errno(e),
            },
            FileOp::Open { path: p, .. } => match std::fs::File::open(path(p)) {
                Ok(file) => {
                    self.next += 1;
                    self.open.insert(self.next, file);
                    self.next as i64
                }
                Err(e) => errno(e),
            },
            FileOp::Pread { handle, len, offset, .. } => match self.open.get(handle) {
                Some(file) => {
                    let mut window = self.window.lock().unwrap();
                    let len = (*len as usize).min(window.len());
                    match std::os::unix::fs::FileExt::read_at(file, &mut window[..len], *offset) {
                        Ok(n) => n as i64,
                        Err(e) => errno(e),
                    }
                }
                None => -(libc::EBADF as i64),
            },
            FileOp::Getdents { handle, len, .. } => match self.open.get(handle) {
                Some(file) => {
                    let mut window = self.window.lock().unwrap();
                    let len = (*len as usize).min(window.len());
                    // SAFETY: getdents64 into the window's first `len` bytes, which it owns.
                    unsafe { libc::syscall(libc::SYS_getdents64, file.as_raw_fd(), window.as_mut_ptr(), len) }
                }
                None => -(libc::EBADF as i64),
            },
            FileOp::Close { handle } => self.open.remove(handle).map_or(-(libc::EBADF as i64), |_| 0),
            _ => -(libc::ENOSYS as i64),
        };
        HostMessage::FileResult { job, request, result }
    }
}

/// Two jobs in a row, each in its own FUSE view of the host's files (served by a fake host
/// from this machine's): a dynamically linked shell reads a file and lists a directory
/// through it, and the second job's mount works after the first one's went. Needs root and
/// /dev/fuse (skipped without).
#[test]
fn jobs_in_a_row_run_in_their_owners_host_files() {
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let shell = std::fs::read("/bin/sh").unwrap();
    let (mut host, mut session, window) = start_with("fuse", &[(0x10_0000, shell.clone())], Some(WINDOW));
    let mut files = FileHost { window, open: HashMap::new(), next: 0, served: 0 };
    let work = host.directory.join("work");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    std::fs::write(work.join("data.txt"), "on the host\n").unwrap();
    let cwd = work.to_str().unwrap().as_bytes().to_vec();
    let argv: [&[u8]; 3] = [b"sh", b"-c", b"read line < data.txt; echo \"$line\"; echo *"];
    for job in [1, 2] {
        let before = files.served;
        host.send(&launch(job, &argv, &cwd, FileImage { name: b"/bin/sh", gpa: 0x10_0000, len: shell.len() as u64 }, &[]));
        let got = host.serving(&mut session, Some(&mut files), Duration::from_secs(20), |m| {
            matches!(m, EnclaveMessage::JobExited { .. } | EnclaveMessage::LaunchFailed { .. })
        });
        let messages = decoded(&got);
        assert_eq!(messages.last(), Some(&EnclaveMessage::JobExited { job, status: 0 }), "job {job}: {messages:?}");
        assert_eq!(output(&messages, Stream::Stdout), "on the host\ndata.txt sub\n", "job {job}");
        assert!(files.served > before + 3, "job {job} read through the FUSE mount ({} calls)", files.served - before);
    }
}

mod stress;
