//! The fake kernel's jobs, chosen by argv[1]: output, exit statuses, inputs, forwarded file
//! calls, XEMEM, and every way an enclave can fail.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use enclave_proto::{EnclaveMessage, FileOp, Stream, FRAME_CONTINUATION};

use super::super::{CHANNEL_GPA, RAM_SIZE, SCRATCH_GPA, SEGMENT_GPA, SEGMENT_PAGES, SEGMENT_VADDR};
use super::{Backing, FakeKernel, FakeMemory, Incoming};

impl FakeKernel {
    pub(super) fn run_job(&mut self, job: u32, argv: &[String], cwd: &str, binary: (String, u64, u64), files: &[(String, u64, u64)]) {
        self.send(EnclaveMessage::JobStarted { job });
        let script = argv.get(1).map(String::as_str).unwrap_or("");
        let status = match script {
            "echo" => {
                let text = format!("{}\n", argv[2..].join(" "));
                self.print(job, Stream::Stdout, &text);
                0
            }
            "exit" => argv[2].parse().unwrap(),
            "big" => {
                let text: String = (0..2000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
                self.print(job, Stream::Stdout, &text);
                self.print(job, Stream::Stderr, "to stderr\n");
                0
            }
            "inputs" => {
                let contents = self.region_bytes(binary.1, binary.2);
                let mut report = format!("binary {} {} bytes, starts {:?}\n", binary.0, contents.len(), &contents[..4]);
                for (name, gpa, len) in files {
                    let text = String::from_utf8(self.region_bytes(*gpa, *len)).unwrap();
                    report.push_str(&format!("input {name}: {text}\n"));
                }
                report.push_str(&format!("cwd {cwd}\n"));
                self.print(job, Stream::Stdout, &report);
                0
            }
            "files" => self.file_script(job, cwd),
            "user-files" => self.user_file_script(job, &argv[2]),
            "slot-then-channel" => self.slot_then_channel_script(job),
            "launch-fails" => {
                self.send(EnclaveMessage::LaunchFailed { job, errno: libc::ENOEXEC, reason: b"not an ELF executable" });
                return;
            }
            "xemem-id" => {
                // The daemon's name server hands this enclave its XEMEM id.
                let found = self.xemem_wait(|kernel| kernel.xemem.id().is_some());
                let text = match self.xemem.id() {
                    Some(id) if found => format!("xemem enclave id {id}\n"),
                    _ => "no xemem id\n".to_string(),
                };
                self.print(job, Stream::Stdout, &text);
                0
            }
            "xemem-owner" => {
                // Makes a named 16-page segment of "job memory" (RAM at SEGMENT_GPA, or lies
                // about its frames), then serves attaches until one (or argv[3]) was resolved.
                // The job's memory is mapped anew, as a real kernel's count would show.
                self.hardware.count_mapping_change();
                self.hardware.xemem_resolves.store(0, Ordering::SeqCst);
                let resolves: u32 = argv.get(3).map_or(1, |n| n.parse().unwrap());
                self.xemem_backing = match argv[2].as_str() {
                    "outside" => Backing::OutsideRam,
                    "channel" => Backing::Channel,
                    _ => Backing::Ram,
                };
                for page in 0..SEGMENT_PAGES {
                    self.hardware.ram.write(SEGMENT_GPA + page * 4096, &(1000 + page).to_le_bytes()).unwrap();
                }
                if !self.xemem_wait(|kernel| kernel.xemem.id().is_some()) {
                    self.print(job, Stream::Stdout, "no xemem id\n");
                    return self.send(EnclaveMessage::JobExited { job, status: 1 });
                }
                let name = xemem::wire::Name::new(format!("fake-seg-{}", argv[2]).as_bytes()).unwrap();
                let owner = xemem::Owner { uid: 0, gid: 0, mode: 0o600 };
                let make =
                    xemem::node::Request::Make { process: 1, vaddr: SEGMENT_VADDR, size: SEGMENT_PAGES * 4096, owner, name: Some(name) };
                let mut memory = FakeMemory { backing: self.xemem_backing, resolves: 0 };
                let request = self.xemem.request(make, &mut memory).unwrap();
                self.xemem_step(None);
                let made = self.xemem_wait(|kernel| kernel.xemem_done.iter().any(|done| done.request == request));
                let served = made && self.xemem_wait(|kernel| kernel.hardware.xemem_resolves.load(Ordering::SeqCst) >= resolves);
                self.print(job, Stream::Stdout, if served { "made and served\n" } else { "not served\n" });
                0
            }
            "xemem-malformed" => {
                // A message whose body length is wrong, sent as this enclave to the name server:
                // the daemon's node must answer it with Failed(Malformed) for the same request.
                if !self.xemem_wait(|kernel| kernel.xemem.id().is_some()) {
                    self.print(job, Stream::Stdout, "no xemem id\n");
                    return self.send(EnclaveMessage::JobExited { job, status: 1 });
                }
                let id = self.xemem.id().unwrap();
                let segment = xemem::ids::SegmentId::new(id, 5).unwrap();
                let remove = xemem::wire::Message::new(77, id, 1, xemem::wire::Body::Remove { process: 1, segment });
                let mut bytes = Vec::new();
                remove.encode(&mut bytes).unwrap();
                bytes.push(0);
                self.send(EnclaveMessage::Xemem { message: &bytes });
                self.xemem_seen.clear();
                let answered = |kernel: &FakeKernel| {
                    kernel.xemem_seen.iter().any(|seen| {
                        matches!(xemem::wire::Message::decode(seen), Ok(m) if m.header.request == 77
                            && m.body == xemem::wire::Body::Failed { error: xemem::Error::Malformed })
                    })
                };
                let text = if self.xemem_wait(answered) { "malformed: answered Failed(Malformed)\n" } else { "malformed: no answer\n" };
                self.print(job, Stream::Stdout, text);
                0
            }
            "garbage" => {
                // A message of an unknown kind, a truncated one, and a continuation out of nowhere:
                // each must be reported and skipped, and the channel must keep working.
                self.send_frame(&[1, 0x77, 0x77]);
                self.send_frame(&[1, 0x04, 0x80, 1]);
                self.send_frame(&[FRAME_CONTINUATION, 1, 2, 3]);
                self.print(job, Stream::Stdout, "still here\n");
                0
            }
            "crash" => {
                *self.hardware.ended.lock().unwrap() = Some("the fake machine triple-faulted".into());
                return;
            }
            "corrupt" => {
                // Moves the guest→host producer counter far beyond what the ring can hold, and
                // sends nothing more (no Pong either): a later send would write the kernel's
                // valid counter over it before a busy daemon had looked.
                self.hardware.hung.store(true, Ordering::SeqCst);
                self.hardware.ram.write(CHANNEL_GPA + 0x40, &(u64::MAX / 2).to_le_bytes()).unwrap();
                return;
            }
            "hang" => {
                self.hardware.hung.store(true, Ordering::SeqCst);
                return;
            }
            "quiet-until-killed" => loop {
                match self.receive() {
                    Some(Incoming::Ping(nonce)) => self.pong(nonce),
                    Some(Incoming::Kill) => break enclave_proto::KILLED_BY_SIGNAL + libc::SIGKILL as u32,
                    Some(_) => {}
                    None => return,
                }
            },
            "panic" => {
                self.send(EnclaveMessage::Panic { text: b"fake kernel gave up" });
                return;
            }
            other => {
                self.print(job, Stream::Stderr, &format!("unknown script {other:?}\n"));
                127
            }
        };
        self.send(EnclaveMessage::JobExited { job, status });
    }

    /// Exercises the forwarded file calls; prints one line per check and fails on a mismatch.
    fn file_script(&mut self, job: u32, cwd: &str) -> u32 {
        let mut checks = Checks { job, failures: 0 };
        let ram = &self.hardware.ram;
        ram.write(SCRATCH_GPA, b"written from the enclave\n").unwrap();
        let (handle, _) =
            self.call(job, FileOp::Open { path: b"out.txt", flags: (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) as u32, mode: 0o644 });
        checks.check(self, "open out.txt for writing", handle > 0);
        let (written, _) = self.call(job, FileOp::Write { handle: handle as u32, gpa: SCRATCH_GPA, len: 25 });
        checks.check(self, "write 25 bytes", written == 25);
        let (closed, _) = self.call(job, FileOp::Close { handle: handle as u32 });
        checks.check(self, "close", closed == 0);
        let (_, size) = self.call(job, FileOp::Stat { path: b"out.txt" });
        checks.check(self, "stat size 25", size == Some(25));
        let absolute = format!("{cwd}/input.txt");
        let (input, _) = self.call(job, FileOp::Open { path: absolute.as_bytes(), flags: libc::O_RDONLY as u32, mode: 0 });
        checks.check(self, "open input by absolute path inside cwd", input > 0);
        let (count, _) = self.call(job, FileOp::Read { handle: input as u32, gpa: SCRATCH_GPA + 4096, len: 100 });
        let mut read_back = vec![0u8; count.max(0) as usize];
        self.hardware.ram.read(SCRATCH_GPA + 4096, &mut read_back).unwrap();
        checks.check(self, "read the input's contents", read_back == b"input data");
        let (_, size) = self.call(job, FileOp::Fstat { handle: input as u32 });
        checks.check(self, "fstat", size == Some(10));
        let (position, _) = self.call(job, FileOp::Lseek { handle: input as u32, offset: 2, whence: 0 });
        checks.check(self, "lseek", position == 2);
        let (count, _) = self.call(job, FileOp::Pread { handle: input as u32, gpa: SCRATCH_GPA, len: 4, offset: 6 });
        checks.check(self, "pread", count == 4);
        let (escape, _) =
            self.call(job, FileOp::Open { path: b"../outside.txt", flags: (libc::O_CREAT | libc::O_WRONLY) as u32, mode: 0o644 });
        checks.check(self, "open ../outside.txt refused with EACCES", escape == -(libc::EACCES as i64));
        let (absolute_escape, _) = self.call(job, FileOp::Stat { path: b"/etc/passwd" });
        checks.check(self, "stat /etc/passwd refused", absolute_escape == -(libc::EACCES as i64));
        let (link_escape, _) = self.call(job, FileOp::Open { path: b"link-out/passwd", flags: libc::O_RDONLY as u32, mode: 0 });
        checks.check(self, "a symbolic link out of the directory is refused", link_escape < 0);
        let (bad_buffer, _) = self.call(job, FileOp::Read { handle: input as u32, gpa: CHANNEL_GPA, len: 16 });
        checks.check(self, "a buffer inside the channel is EFAULT", bad_buffer == -(libc::EFAULT as i64));
        let (outside_ram, _) = self.call(job, FileOp::Write { handle: input as u32, gpa: RAM_SIZE * 4, len: 16 });
        checks.check(self, "a buffer outside RAM is EFAULT", outside_ram == -(libc::EFAULT as i64));
        let (bad_handle, _) = self.call(job, FileOp::Close { handle: 9999 });
        checks.check(self, "an unknown handle is EBADF", bad_handle == -(libc::EBADF as i64));
        let (made, _) = self.call(job, FileOp::Mkdir { path: b"results", mode: 0o755 });
        checks.check(self, "mkdir results", made == 0);
        let (unlinked, _) = self.call(job, FileOp::Unlink { path: b"out.txt" });
        checks.check(self, "unlink out.txt", unlinked == 0);
        checks.failures
    }

    /// An unconfined job: an input by absolute path outside its directory, a large read and
    /// write straight into its memory, a short read at the end of the file, and buffers the
    /// enclave may not name (in the channel, across the end of RAM) refused.
    fn user_file_script(&mut self, job: u32, input: &str) -> u32 {
        let mut checks = Checks { job, failures: 0 };
        const BIG: u32 = 2 << 20;
        let (handle, _) = self.call(job, FileOp::Open { path: input.as_bytes(), flags: libc::O_RDONLY as u32, mode: 0 });
        checks.check(self, "open an input by absolute path outside the working directory", handle > 0);
        let handle = handle as u32;
        let (count, _) = self.call(job, FileOp::Read { handle, gpa: SCRATCH_GPA, len: BIG });
        let mut data = vec![0u8; BIG as usize];
        self.hardware.ram.read(SCRATCH_GPA, &mut data).unwrap();
        let expected: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
        checks.check(self, "a 2 MiB read lands in enclave memory", count == BIG as i64 && data == expected);
        // Past the data read above, which is written back below.
        let spare = SCRATCH_GPA + BIG as u64;
        let (short, _) = self.call(job, FileOp::Pread { handle, gpa: spare, len: 8192, offset: BIG as u64 - 100 });
        checks.check(self, "a read at the end of the file is short", short == 100);
        let (end, _) = self.call(job, FileOp::Read { handle, gpa: spare, len: 4096 });
        checks.check(self, "and then empty", end == 0);
        let (straddles, _) = self.call(job, FileOp::Pread { handle, gpa: CHANNEL_GPA - 4096, len: 8192, offset: 0 });
        checks.check(self, "a buffer running into the channel is EFAULT", straddles == -(libc::EFAULT as i64));
        let (beyond, _) = self.call(job, FileOp::Pread { handle, gpa: u64::MAX - 4095, len: 8192, offset: 0 });
        checks.check(self, "a buffer wrapping around the address space is EFAULT", beyond == -(libc::EFAULT as i64));
        let (copy, _) = self.call(job, FileOp::Open { path: b"copy", flags: (libc::O_CREAT | libc::O_WRONLY) as u32, mode: 0o644 });
        let (written, _) = self.call(job, FileOp::Pwrite { handle: copy as u32, gpa: SCRATCH_GPA, len: BIG, offset: 0 });
        checks.check(self, "a 2 MiB write from enclave memory", written == BIG as i64);
        let (refused, _) = self.call(job, FileOp::Write { handle: copy as u32, gpa: RAM_SIZE - 4096, len: 8192 });
        checks.check(self, "a write from beyond RAM is EFAULT", refused == -(libc::EFAULT as i64));
        checks.failures
    }

    /// The LWK's mix of paths: a few file calls through a file slot, each followed by one on
    /// the channel (the LWK's way for a call too long for a slot, or while its slot is held).
    /// Prints how long the slowest channel call took.
    fn slot_then_channel_script(&mut self, job: u32) -> u32 {
        let mut checks = Checks { job, failures: 0 };
        let published = self.publish_slots();
        checks.check(self, "the host serves the file slot", published);
        let mut slowest = Duration::ZERO;
        for _ in 0..3 {
            let (_, size) = self.slot_call(job, FileOp::Stat { path: b"input.txt" });
            checks.check(self, "stat through the file slot", size == Some(10));
            let started = Instant::now();
            let (_, size) = self.call(job, FileOp::Stat { path: b"input.txt" });
            slowest = slowest.max(started.elapsed());
            checks.check(self, "stat over the channel", size == Some(10));
        }
        self.print(job, Stream::Stdout, &format!("slowest channel call after a slot call: {} ms\n", slowest.as_millis()));
        checks.failures
    }
}

/// A fake job script's checks: each one a line of the job's stdout ("ok WHAT" or "FAIL WHAT"),
/// the failures counted for its exit status.
struct Checks {
    job: u32,
    failures: u32,
}

impl Checks {
    fn check(&mut self, kernel: &mut FakeKernel, what: &str, ok: bool) {
        kernel.print(self.job, Stream::Stdout, &format!("{} {what}\n", if ok { "ok" } else { "FAIL" }));
        if !ok {
            self.failures += 1;
        }
    }
}
