//! The persistent-enclave path end to end, against an in-process fake enclave: a thread that
//! plays the LWK's side of `enclave-proto` over a real `clowder-channel` ring pair in an
//! ordinary memfd. The daemon runs in this process with a launcher that makes fakes; clients
//! talk to it over its real socket.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clowder_channel::{Channel, Endpoint};
use clowder_test_support::{daemon_config, serve, TempDir};
use clowderd::client::Client;
use clowderd::console::LogBook;
use clowderd::daemon::Daemon;
use clowderd::enclave::Liveness;
use clowderd::guest_ram::{GuestRam, RamRange};
use clowderd::machine::{ChannelParts, Launcher, Machine, MachineSpec, Populated, SharedRegion};
use clowderd::sys;
use enclave_proto::{
    EnclaveMessage, FileOp, Fragmenter, HostMessage, Reassembler, Stream, FRAME_CONTINUATION, MAX_MESSAGE_LEN, PROTOCOL_VERSION,
};
use serde_json::{json, Value};

mod support;

const RAM_SIZE: u64 = 4 << 20;
const CHANNEL_SIZE: u64 = 64 << 10;
const CHANNEL_GPA: u64 = RAM_SIZE - CHANNEL_SIZE;
/// Where the fake job keeps its I/O buffers.
const SCRATCH_GPA: u64 = 0x10000;
/// Where the fake kernel keeps its count of page-table changes (`MappingCounter`).
const COUNTER_GPA: u64 = 0x8000;
const REGION_BASE: u64 = 1 << 32;

/// The fake kernels' clock origin (their XEMEM nodes count milliseconds from it).
static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// What the fake machine shares between its "hardware" (this struct) and its kernel thread.
struct FakeHardware {
    ram: GuestRam,
    /// Regions the daemon shared, by guest-physical base.
    regions: Mutex<HashMap<u64, File>>,
    ended: Mutex<Option<String>>,
    /// Set by the jobs `hang` and `corrupt`: the kernel stops answering pings.
    hung: AtomicBool,
    doorbell: File,
    /// How many attaches of its segments the fake kernel's node resolved.
    xemem_resolves: AtomicU32,
}

impl FakeHardware {
    /// What the fake kernel does to its published count when a job's memory is mapped anew.
    fn count_mapping_change(&self) {
        let mut word = [0u8; 8];
        self.ram.read(COUNTER_GPA, &mut word).unwrap();
        self.ram.write(COUNTER_GPA, &(u64::from_le_bytes(word) + 1).to_le_bytes()).unwrap();
    }
}

/// Every fake machine's hardware by enclave name, for tests that look inside one.
static MACHINES: std::sync::LazyLock<Mutex<HashMap<String, Arc<FakeHardware>>>> = std::sync::LazyLock::new(Mutex::default);

fn fake_hardware(enclave: &str) -> Arc<FakeHardware> {
    MACHINES.lock().unwrap().get(enclave).cloned().unwrap_or_else(|| panic!("no fake machine {enclave}"))
}

struct FakeMachine {
    hardware: Arc<FakeHardware>,
    memfd: File,
    interrupt: File,
    next_slot: u32,
    slots: HashMap<u32, u64>,
}

struct FakeLauncher;

impl Launcher for FakeLauncher {
    fn launch(&self, spec: &MachineSpec, log: Arc<LogBook>, _: &mut dyn FnMut(Populated)) -> Result<Box<dyn Machine>, String> {
        let memfd = sys::memfd("fake-enclave").map_err(|e| e.to_string())?;
        memfd.set_len(RAM_SIZE).map_err(|e| e.to_string())?;
        let ranges = vec![RamRange { gpa: 0, size: RAM_SIZE, file_offset: 0 }];
        // The fake's own view of its RAM; the channel is not reserved from the kernel's side.
        let ram = GuestRam::map(&memfd, ranges, (0, 0)).map_err(|e| e.to_string())?;
        let base = ram.host_address(CHANNEL_GPA, CHANNEL_SIZE).unwrap();
        // SAFETY: the region lies inside `ram`'s mapping, which the hardware keeps alive as long
        // as the kernel thread runs; nobody else touches it during init (the VMM's role).
        let channel = unsafe { Channel::init(base, CHANNEL_SIZE as usize) }.unwrap();
        let hardware = Arc::new(FakeHardware {
            ram,
            regions: Mutex::new(HashMap::new()),
            ended: Mutex::new(None),
            hung: AtomicBool::new(false),
            doorbell: sys::eventfd().unwrap(),
            xemem_resolves: AtomicU32::new(0),
        });
        MACHINES.lock().unwrap().insert(spec.name.clone(), hardware.clone());
        let kernel = FakeKernel::new(hardware.clone(), channel.guest_end().unwrap(), spec.cores.len() as u16);
        std::thread::spawn(move || kernel.run());
        log.push(format!("fake machine for {} started", spec.name));
        Ok(Box::new(FakeMachine { hardware, memfd, interrupt: sys::eventfd().unwrap(), next_slot: 10, slots: HashMap::new() }))
    }
}

impl Machine for FakeMachine {
    fn pid(&self) -> Option<u32> {
        None
    }

    fn channel(&mut self) -> Result<ChannelParts, String> {
        Ok(ChannelParts {
            memfd: self.memfd.try_clone().unwrap(),
            ram: vec![RamRange { gpa: 0, size: RAM_SIZE, file_offset: 0 }],
            channel_gpa: CHANNEL_GPA,
            channel_size: CHANNEL_SIZE,
            channel_offset: CHANNEL_GPA,
            doorbell: self.hardware.doorbell.try_clone().unwrap(),
            interrupt: self.interrupt.try_clone().unwrap(),
        })
    }

    fn add_region(&mut self, file: &File, len: u64) -> Result<SharedRegion, String> {
        assert_eq!(len % 4096, 0, "regions are page multiples");
        let slot = self.next_slot;
        self.next_slot += 1;
        let gpa = REGION_BASE + slot as u64 * (1 << 30);
        self.hardware.regions.lock().unwrap().insert(gpa, file.try_clone().unwrap());
        self.slots.insert(slot, gpa);
        Ok(SharedRegion { slot, gpa })
    }

    fn remove_region(&mut self, slot: u32) -> Result<(), String> {
        let gpa = self.slots.remove(&slot).ok_or("no such slot")?;
        self.hardware.regions.lock().unwrap().remove(&gpa);
        Ok(())
    }

    fn ended(&mut self) -> Option<String> {
        self.hardware.ended.lock().unwrap().clone()
    }

    fn shut_down(&mut self, _grace: Duration) -> String {
        self.hardware.ended.lock().unwrap().get_or_insert_with(|| "fake machine powered off".into()).clone()
    }
}

/// The guest side: a tiny kernel that runs scripted "jobs" chosen by argv[1].
struct FakeKernel {
    hardware: Arc<FakeHardware>,
    endpoint: Endpoint,
    vcpus: u16,
    frame: Vec<u8>,
    assembly: Vec<u8>,
    next_request: u32,
    /// The enclave's XEMEM node (not the name server), linked to the daemon's over the channel.
    xemem: xemem::node::Node,
    /// Raw XEMEM messages from the daemon, kept for the `xemem-*` jobs to look at.
    xemem_seen: Vec<Vec<u8>>,
    /// Finished XEMEM requests of the fake job.
    xemem_done: Vec<xemem::node::Completion>,
    /// Where the fake job's segment claims to live (`xemem-owner MODE`).
    xemem_backing: Backing,
}

/// The fake job's exported memory: virtual `SEGMENT_VADDR..` is RAM at `SEGMENT_GPA..`, unless
/// the fake kernel lies about its frames.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backing {
    Ram,
    OutsideRam,
    Channel,
}

const SEGMENT_VADDR: u64 = 0x4000_0000;
const SEGMENT_GPA: u64 = 2 << 20;
const SEGMENT_PAGES: u64 = 16;

struct FakeMemory {
    backing: Backing,
    resolves: u32,
}

impl xemem::node::LocalMemory for FakeMemory {
    fn resolve(&mut self, process: u64, vaddr: u64, size: u64) -> Result<Vec<xemem::wire::FrameRun>, xemem::Error> {
        let end = SEGMENT_VADDR + SEGMENT_PAGES * 4096;
        if process != 1 || vaddr < SEGMENT_VADDR || vaddr + size > end {
            return Err(xemem::Error::NotFound);
        }
        self.resolves += 1;
        let gpa = match self.backing {
            Backing::Ram => SEGMENT_GPA + (vaddr - SEGMENT_VADDR),
            Backing::OutsideRam => RAM_SIZE * 4,
            Backing::Channel => CHANNEL_GPA,
        };
        // Two runs, to show the daemon handles each: the first page, then the rest.
        let first = xemem::wire::FrameRun { first: Some(gpa / 4096), frames: 1 };
        let rest = xemem::wire::FrameRun { first: Some(gpa / 4096 + 1), frames: size / 4096 - 1 };
        Ok(if size > 4096 { vec![first, rest] } else { vec![first] })
    }
    fn notify(&mut self, _: u64, _: xemem::ids::SegmentId) {}
    fn revoke(&mut self, _: u64, _: xemem::ids::AccessId) {}
}

/// A decoded host message, owned (the fake keeps messages past the receive buffer).
enum Incoming {
    Launch { job: u32, argv: Vec<String>, cwd: String, binary: (String, u64, u64), files: Vec<(String, u64, u64)> },
    Ping(u64),
    Kill,
    Shutdown,
    Reply { request: u32, result: i64, size: Option<u64> },
    Xemem(Vec<u8>),
}

impl FakeKernel {
    fn new(hardware: Arc<FakeHardware>, endpoint: Endpoint, vcpus: u16) -> FakeKernel {
        let frame = vec![0; endpoint.max_message_len()];
        let xemem = xemem::node::Node::new(1, None, xemem::node::Timing { retry_after: 200, attempts: 5 });
        FakeKernel {
            hardware,
            endpoint,
            vcpus,
            frame,
            assembly: vec![0; MAX_MESSAGE_LEN],
            next_request: 1,
            xemem,
            xemem_seen: Vec::new(),
            xemem_done: Vec::new(),
            xemem_backing: Backing::Ram,
        }
    }

    fn send_frame(&mut self, frame: &[u8]) {
        // A hung kernel sends nothing: not a Pong, and not the XEMEM answers its loop still
        // produces (one would also write a valid producer counter over a "corrupt" one).
        if self.hardware.hung.load(Ordering::SeqCst) {
            return;
        }
        while self.endpoint.send(frame).is_err() {
            std::thread::sleep(Duration::from_micros(100));
        }
        if self.endpoint.peer_waiting() {
            sys::signal_eventfd(&self.hardware.doorbell).unwrap();
        }
    }

    fn send(&mut self, message: EnclaveMessage) {
        let mut bytes = vec![0u8; MAX_MESSAGE_LEN];
        let length = message.encode(&mut bytes).unwrap();
        let max = self.endpoint.max_message_len();
        let mut fragmenter = Fragmenter::new(&bytes[..length], max).unwrap();
        let mut frame = vec![0u8; max];
        while let Some(frame_len) = fragmenter.next_frame(&mut frame) {
            self.send_frame(&frame[..frame_len]);
        }
    }

    fn receive(&mut self) -> Option<Incoming> {
        let mut reassembler = Reassembler::new(&mut self.assembly);
        loop {
            if self.hardware.ended.lock().unwrap().is_some() {
                return None;
            }
            let Some(length) = self.endpoint.recv(&mut self.frame).unwrap() else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let Some(message) = reassembler.push(&self.frame[..length]).unwrap() else { continue };
            let owned = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
            return Some(match HostMessage::decode(message).expect("the daemon sends valid messages") {
                HostMessage::LaunchJob(launch) => Incoming::Launch {
                    job: launch.job,
                    argv: launch.argv.iter().map(owned).collect(),
                    cwd: owned(launch.cwd),
                    binary: (owned(launch.binary.name), launch.binary.gpa, launch.binary.len),
                    files: launch.files.iter().map(|f| (owned(f.name), f.gpa, f.len)).collect(),
                },
                HostMessage::Ping { nonce } => Incoming::Ping(nonce),
                HostMessage::KillJob { .. } | HostMessage::SignalJob { .. } => Incoming::Kill,
                HostMessage::Shutdown => Incoming::Shutdown,
                HostMessage::FileResult { request, result, .. } => Incoming::Reply { request, result, size: None },
                HostMessage::FileAttributes { request, attributes, .. } => {
                    Incoming::Reply { request, result: 0, size: Some(attributes.size) }
                }
                HostMessage::Xemem { message } => Incoming::Xemem(message.to_vec()),
                HostMessage::MemoryZeroed { request, result } => Incoming::Reply { request, result: result as i64, size: None },
                HostMessage::SocketResult { request, result, .. } => Incoming::Reply { request, result, size: None },
                HostMessage::SocketReady { .. } | HostMessage::SharedFileTruncated { .. } => continue,
            });
        }
    }

    fn run(mut self) {
        self.send(EnclaveMessage::Hello { version: PROTOCOL_VERSION, vcpus: self.vcpus, memory: RAM_SIZE });
        self.send(EnclaveMessage::MappingCounter { gpa: COUNTER_GPA });
        self.xemem_step(None);
        while let Some(incoming) = self.receive() {
            match incoming {
                Incoming::Ping(nonce) => self.pong(nonce),
                Incoming::Xemem(bytes) => self.xemem_step(Some(&bytes)),
                Incoming::Launch { job, argv, cwd, binary, files } => self.run_job(job, &argv, &cwd, binary, &files),
                Incoming::Shutdown => {
                    *self.hardware.ended.lock().unwrap() = Some("the fake kernel shut down".into());
                    return;
                }
                Incoming::Kill | Incoming::Reply { .. } => {}
            }
        }
    }

    /// Feeds the XEMEM node (a message from the daemon, or only the time) and sends its outbox.
    fn xemem_step(&mut self, bytes: Option<&[u8]>) {
        let now = Instant::now().duration_since(*START).as_millis() as u64;
        let mut memory = FakeMemory { backing: self.xemem_backing, resolves: 0 };
        self.xemem.tick(now, &mut memory);
        if let Some(bytes) = bytes {
            self.xemem_seen.push(bytes.to_vec());
            self.xemem.receive(0, bytes, &mut memory);
        }
        self.hardware.xemem_resolves.fetch_add(memory.resolves, Ordering::SeqCst);
        self.xemem_done.extend(self.xemem.completions());
        for (_, message) in self.xemem.outbox() {
            let mut encoded = Vec::new();
            message.encode(&mut encoded).unwrap();
            self.send(EnclaveMessage::Xemem { message: &encoded });
        }
    }

    /// Serves the channel until `done` says so (or 5 s pass: false).
    fn xemem_wait(&mut self, done: impl Fn(&FakeKernel) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done(self) {
            if Instant::now() > deadline {
                return false;
            }
            match self.receive() {
                Some(Incoming::Xemem(bytes)) => self.xemem_step(Some(&bytes)),
                Some(Incoming::Ping(nonce)) => {
                    self.pong(nonce);
                    self.xemem_step(None);
                }
                Some(_) => {}
                None => return false,
            }
        }
        true
    }

    fn pong(&mut self, nonce: u64) {
        self.send(EnclaveMessage::Pong { nonce });
    }

    fn print(&mut self, job: u32, stream: Stream, text: &str) {
        let chunk = enclave_proto::max_output_chunk(self.endpoint.max_message_len());
        for piece in text.as_bytes().chunks(chunk) {
            self.send(EnclaveMessage::JobOutput { job, stream, data: piece });
        }
    }

    /// A forwarded file call: send it, answer pings until its reply arrives.
    fn call(&mut self, job: u32, op: FileOp) -> (i64, Option<u64>) {
        let request = self.next_request;
        self.next_request += 1;
        self.send(EnclaveMessage::FileRequest { job, request, op });
        loop {
            match self.receive() {
                Some(Incoming::Reply { request: answered, result, size }) if answered == request => return (result, size),
                Some(Incoming::Ping(nonce)) => self.pong(nonce),
                Some(_) => {}
                None => return (-1, None),
            }
        }
    }

    fn region_bytes(&self, gpa: u64, len: u64) -> Vec<u8> {
        let regions = self.hardware.regions.lock().unwrap();
        let file = regions.get(&gpa).expect("the daemon shared this region");
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }

    fn run_job(&mut self, job: u32, argv: &[String], cwd: &str, binary: (String, u64, u64), files: &[(String, u64, u64)]) {
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

struct TestDaemon {
    socket: PathBuf,
    daemon: Arc<Daemon>,
    /// The jobs' binary: the fake enclaves never run it, but the daemon checks that an LWK
    /// could (a static x86-64 executable).
    program: PathBuf,
    _dir: TempDir,
}

fn start_daemon(label: &str, liveness: Liveness) -> TestDaemon {
    let dir = TempDir::new(&format!("clowderd-{label}"));
    let config = daemon_config(PathBuf::from("/nonexistent/clowder-vmm"), PathBuf::from("/nonexistent/lwk"), liveness);
    let daemon = Daemon::new(config, Box::new(FakeLauncher));
    let socket = serve(daemon.clone(), &dir.0);
    let program = dir.0.join("prog");
    std::fs::write(&program, static_executable_stub()).unwrap();
    TestDaemon { socket, daemon, program, _dir: dir }
}

/// A daemon for test `label` (`liveness`) with the one enclave `enclave`, and a scratch
/// directory for its jobs (`clowderd-LABEL-work`).
fn daemon_with_enclave(label: &str, liveness: Liveness, enclave: &str) -> (TestDaemon, TempDir) {
    let daemon = start_daemon(label, liveness);
    daemon.create(enclave);
    (daemon, TempDir::new(&format!("clowderd-{label}-work")))
}

/// A page holding the ELF header and one loadable segment of a static x86-64 executable
/// (nothing runs it).
fn static_executable_stub() -> Vec<u8> {
    let mut bytes = vec![0u8; 4096];
    bytes[..4].copy_from_slice(b"\x7fELF");
    bytes[4] = 2; // 64-bit
    bytes[5] = 1; // little-endian
    bytes[6] = 1; // version
    bytes[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    bytes[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    bytes[24..32].copy_from_slice(&0x40_0078u64.to_le_bytes()); // entry
    bytes[32..40].copy_from_slice(&64u64.to_le_bytes()); // program headers right after
    bytes[52..54].copy_from_slice(&64u16.to_le_bytes());
    bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
    bytes[56..58].copy_from_slice(&1u16.to_le_bytes());
    bytes[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    bytes[68..72].copy_from_slice(&5u32.to_le_bytes()); // R+X
    bytes[80..88].copy_from_slice(&0x40_0000u64.to_le_bytes()); // vaddr
    bytes[96..104].copy_from_slice(&4096u64.to_le_bytes()); // file size
    bytes[104..112].copy_from_slice(&4096u64.to_le_bytes()); // memory size
    bytes
}

/// Short enough that a hang is seen within seconds, long enough that a loaded two-core machine
/// (a parallel build beside the tests) does not make a healthy fake kernel miss its Ping: at
/// 400 ms, a crashing enclave was sometimes reported hung first, and the survivor's run failed.
fn quick_liveness() -> Liveness {
    Liveness { hello_timeout: Duration::from_secs(5), ping_interval: Duration::from_millis(100), ping_timeout: Duration::from_secs(2) }
}

impl TestDaemon {
    fn client(&self) -> Client {
        Client::connect_to(&self.socket).unwrap()
    }

    fn call(&self, request: Value) -> Value {
        self.client().call(&request).unwrap()
    }

    fn create(&self, name: &str) {
        let reply = self.call(json!({"op": "create", "name": name, "cores": 1, "mem": "16M"}));
        assert_eq!(reply["ok"], true, "{reply}");
    }

    /// Runs a job in `enclave` from directory `cwd`; returns (final reply, stdout, stderr).
    fn run(&self, enclave: &str, argv: &[&str], cwd: &Path, inputs: &[(&str, &Path)]) -> (Value, String, String) {
        self.run_program(&self.program, enclave, argv, cwd, inputs, None)
    }

    /// `run` with another program file, confined to `confine` if given.
    fn run_program(
        &self,
        program: &Path,
        enclave: &str,
        argv: &[&str],
        cwd: &Path,
        inputs: &[(&str, &Path)],
        confine: Option<&Path>,
    ) -> (Value, String, String) {
        let binary = File::open(program).unwrap();
        let dir = File::open(cwd).unwrap();
        let input_files: Vec<File> = inputs.iter().map(|(_, path)| File::open(path).unwrap()).collect();
        let mut fds = vec![binary.as_raw_fd(), dir.as_raw_fd()];
        fds.extend(input_files.iter().map(|f| f.as_raw_fd()));
        let mut request = json!({
            "op": "run", "enclave": enclave, "argv": argv, "cwd": cwd.to_str().unwrap(),
            "files": inputs.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        });
        if let Some(dir) = confine {
            request["confine"] = json!(dir.to_str().unwrap());
        }
        let (mut stdout, mut stderr) = (String::new(), String::new());
        let reply = self
            .client()
            .call_streaming(&request, &fds, &mut |event| {
                if event["event"] == "output" {
                    let text = event["text"].as_str().unwrap();
                    if event["stream"] == "stderr" {
                        stderr.push_str(text)
                    } else {
                        stdout.push_str(text)
                    }
                }
            })
            .unwrap();
        (reply, stdout, stderr)
    }

    fn wait_until_removed(&self, name: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let list = self.call(json!({"op": "ls"}));
            let removed = list["removed"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned();
            let present = list["enclaves"].as_array().unwrap().iter().any(|e| e["name"] == name);
            if let (Some(removed), false) = (removed, present) {
                return removed["reason"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "enclave {name} was not removed: {list}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn jobs_stream_output_and_return_their_status() {
    let (daemon, work) = daemon_with_enclave("jobs", Liveness::default(), "sim");
    let (reply, stdout, _) = daemon.run("sim", &["prog", "echo", "hello", "enclave"], &work.0, &[]);
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["status"], 0);
    assert_eq!(stdout, "hello enclave\n");

    assert_eq!(reply["job"], 1);

    // A program the enclave cannot run is refused, and takes no job number.
    let script = work.0.join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let (refused, _, _) = daemon.run_program(&script, "sim", &["script.sh"], &work.0, &[], None);
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("script.sh is not an ELF executable"), "{refused}");

    let (reply, _, _) = daemon.run("sim", &["prog", "exit", "42"], &work.0, &[]);
    assert_eq!(reply["status"], 42);
    assert_eq!(reply["job"], 2, "job numbers follow each other: {reply}");

    // Output longer than a ring message arrives in order, on the right stream.
    let (reply, stdout, stderr) = daemon.run("sim", &["prog", "big"], &work.0, &[]);
    assert_eq!(reply["status"], 0);
    assert_eq!(stdout.len(), 2000);
    assert!(stdout.starts_with("abcdefghijklmnopqrstuvwxyzabc"));
    assert_eq!(stderr, "to stderr\n");

    let list = daemon.call(json!({"op": "ls"}));
    assert_eq!(list["enclaves"][0]["name"], "sim");
    assert_eq!(list["enclaves"][0]["state"], "ready");
    assert_eq!(list["enclaves"][0]["jobs"], 0);
}

#[test]
fn a_quiet_job_is_killed_when_its_client_goes_away() {
    let (daemon, work) = daemon_with_enclave("client-gone", quick_liveness(), "sim");
    let binary = File::open(&daemon.program).unwrap();
    let dir = File::open(&work.0).unwrap();
    let request = json!({
        "op": "run", "enclave": "sim", "argv": ["prog", "quiet-until-killed"], "cwd": work.0.to_str().unwrap(), "files": [],
    });
    let stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let limits = clowder_api::codec::Limits { max_line: 1 << 20, max_fds: 0, timeout: None };
    let mut socket = clowder_api::codec::LineSocket::new(stream, limits);
    socket.send(&request, &[binary.as_raw_fd(), dir.as_raw_fd()]).unwrap();
    let (started, _) = socket.receive_json::<serde_json::Value>().unwrap().unwrap();
    assert_eq!(started["event"], "started", "{started}");
    assert_eq!(daemon.call(json!({"op": "ls"}))["enclaves"][0]["jobs"], 1);
    // The job prints nothing, so no failed write tells the daemon; the hang-up alone must.
    drop(socket);
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.call(json!({"op": "ls"}))["enclaves"][0]["jobs"] != 0 {
        assert!(Instant::now() < deadline, "the job outlived its client by 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = daemon.call(json!({"op": "logs", "name": "sim"}));
    assert!(logs.to_string().contains("exited with status 137"), "{logs}");
}

#[test]
fn the_binary_and_input_files_are_shared_into_the_enclave() {
    let (daemon, work) = daemon_with_enclave("inputs", Liveness::default(), "sim");
    let input = work.0.join("params.txt");
    std::fs::write(&input, "nx=64").unwrap();
    let (reply, stdout, _) = daemon.run("sim", &["/path/to/prog", "inputs"], &work.0, &[("params.txt", &input)]);
    assert_eq!(reply["ok"], true, "{reply}");
    let binary_len = std::fs::metadata(&daemon.program).unwrap().len();
    assert!(stdout.contains(&format!("binary prog {binary_len} bytes, starts [127, 69, 76, 70]")), "{stdout}");
    assert!(stdout.contains("input params.txt: nx=64"), "{stdout}");
    assert!(stdout.contains(&format!("cwd {}", work.0.display())), "{stdout}");
}

#[test]
fn forwarded_file_calls_stay_inside_the_working_directory() {
    let (daemon, outer) = daemon_with_enclave("files", Liveness::default(), "sim");
    let work = outer.0.join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("input.txt"), "input data").unwrap();
    std::os::unix::fs::symlink("/etc", work.join("link-out")).unwrap();
    let (reply, stdout, _) = daemon.run_program(&daemon.program, "sim", &["prog", "files"], &work, &[], Some(&work));
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(reply["status"], 0, "{reply}\n{stdout}");
    assert!(!outer.0.join("outside.txt").exists(), "a file was created outside the job's directory");
    assert!(work.join("results").is_dir());
    assert!(!work.join("out.txt").exists(), "unlink reached the host");
    let logs = daemon.call(json!({"op": "logs", "name": "sim"}));
    let logs = logs["lines"].to_string();
    assert!(logs.contains("leaves the job's directory"), "refusals are logged: {logs}");
}

#[test]
fn unconfined_jobs_reach_the_users_files_and_move_data_directly() {
    let (daemon, outer) = daemon_with_enclave("user-files", Liveness::default(), "sim");
    let (work, inputs) = (outer.0.join("work"), outer.0.join("inputs"));
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(&inputs).unwrap();
    let deck: Vec<u8> = (0..2u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(inputs.join("deck"), &deck).unwrap();
    let input = inputs.join("deck");
    let (reply, stdout, _) = daemon.run("sim", &["prog", "user-files", input.to_str().unwrap()], &work, &[]);
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(reply["status"], 0, "{reply}\n{stdout}");
    assert!(std::fs::read(work.join("copy")).unwrap() == deck, "the write reached the host whole");
    // Confined to its directory, the same job may not name the input.
    let (reply, stdout, _) =
        daemon.run_program(&daemon.program, "sim", &["prog", "user-files", input.to_str().unwrap()], &work, &[], Some(&work));
    assert!(stdout.contains("FAIL open an input by absolute path outside"), "{stdout}");
    assert_ne!(reply["status"], 0);
    // A confinement that does not hold the working directory is refused before the job runs.
    let (reply, _, _) = daemon.run_program(&daemon.program, "sim", &["prog", "echo"], &work, &[], Some(&inputs));
    assert!(reply["error"].as_str().unwrap_or("").contains("outside the confinement directory"), "{reply}");
}

#[test]
fn launch_failures_and_malformed_messages_get_clear_errors() {
    let (daemon, work) = daemon_with_enclave("malformed", Liveness::default(), "sim");
    let (reply, _, _) = daemon.run("sim", &["prog", "launch-fails"], &work.0, &[]);
    assert_eq!(reply["ok"], false);
    assert!(reply["error"].as_str().unwrap().contains("not an ELF executable"), "{reply}");

    let (reply, stdout, _) = daemon.run("sim", &["prog", "garbage"], &work.0, &[]);
    assert_eq!(reply["status"], 0, "{reply}");
    assert_eq!(stdout, "still here\n");
    let logs = daemon.call(json!({"op": "logs", "name": "sim"}))["lines"].to_string();
    assert!(logs.contains("unknown message kind 0x7777"), "{logs}");
    assert!(logs.contains("message truncated"), "{logs}");
    assert!(logs.contains("continuation frame without a start frame"), "{logs}");
}

#[test]
fn a_failed_enclave_is_removed_and_the_others_keep_working() {
    let (daemon, work) = daemon_with_enclave("containment", quick_liveness(), "survivor");
    // Each failure in turn, in an enclave beside the survivor (the host may have two cores).
    let failures = [
        ("crashes", "crash", "triple-faulted", "its machine ended"),
        ("hangs", "hang", "stopped answering Ping", "Ping"),
        ("panics", "panic", "fake kernel gave up", "panicked"),
        ("corrupts", "corrupt", "channel corrupted by the enclave", "channel corrupted"),
    ];
    for (name, script, job_error, removal) in failures {
        daemon.create(name);
        let (reply, _, _) = daemon.run(name, &["prog", script], &work.0, &[]);
        assert_eq!(reply["ok"], false);
        assert!(reply["error"].as_str().unwrap().contains(job_error), "{reply}");
        assert!(daemon.wait_until_removed(name).contains(removal));
        let (reply, stdout, _) = daemon.run("survivor", &["prog", "echo", "fine"], &work.0, &[]);
        assert_eq!(reply["status"], 0, "{reply}");
        assert_eq!(stdout, "fine\n");
    }
    let logs = daemon.call(json!({"op": "logs", "name": "hangs"}));
    assert!(logs["removed"].as_str().unwrap().contains("Ping"), "{logs}");
}

#[test]
fn removing_an_enclave_frees_its_cores_and_ends_its_jobs() {
    let daemon = start_daemon("remove", Liveness::default());
    daemon.create("a");
    let reply = daemon.call(json!({"op": "rm", "name": "a"}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert!(reply["how"].as_str().unwrap().contains("the fake kernel shut down"), "Shutdown reaches the kernel: {reply}");
    let reply = daemon.call(json!({"op": "rm", "name": "a"}));
    assert!(reply["error"].as_str().unwrap().contains("no enclave named a"), "{reply}");
    // Its core is free again: as many one-core enclaves as usable cores fit.
    let usable = clowderd::cores::usable_cores().unwrap().len();
    for index in 0..usable {
        daemon.create(&format!("e{index}"));
    }
    let reply = daemon.call(json!({"op": "create", "name": "one-too-many", "cores": 1, "mem": "16M"}));
    assert!(reply["error"].as_str().unwrap().contains("only 0 free"), "{reply}");
}

#[test]
fn enclaves_get_xemem_ids_from_the_daemons_name_server() {
    let daemon = start_daemon("xemem", Liveness::default());
    daemon.create("first");
    daemon.create("second");
    let work = TempDir::new("clowderd-xemem-work");
    let mut ids = Vec::new();
    for enclave in ["first", "second"] {
        let (reply, stdout, _) = daemon.run(enclave, &["prog", "xemem-id"], &work.0, &[]);
        assert_eq!(reply["status"], 0, "{reply}");
        let id: u32 = stdout.trim().strip_prefix("xemem enclave id ").unwrap_or_else(|| panic!("{enclave}: {stdout}")).parse().unwrap();
        ids.push(id);
    }
    // Enclave 1 is the name server itself; every enclave gets an id of its own.
    assert!(ids.iter().all(|&id| id >= 2), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    // A malformed XEMEM message is answered with an error, and the link keeps working.
    let (reply, stdout, _) = daemon.run("first", &["prog", "xemem-malformed"], &work.0, &[]);
    assert_eq!(reply["status"], 0, "{reply}");
    assert_eq!(stdout, "malformed: answered Failed(Malformed)\n");
    let (_, stdout, _) = daemon.run("first", &["prog", "xemem-id"], &work.0, &[]);
    assert_eq!(stdout, format!("xemem enclave id {}\n", ids[0]));
}

/// A daemon for test `label` with the one enclave `enclave`, a working directory for its jobs,
/// and the daemon's XEMEM links, through which the tests attach as a host process would.
fn xemem_owner_daemon(label: &str, enclave: &str) -> (TestDaemon, TempDir, Arc<clowderd::xemem::XememLinks>) {
    let (daemon, work) = daemon_with_enclave(label, Liveness::default(), enclave);
    let links = daemon.daemon.xemem_links().clone();
    (daemon, work, links)
}

/// Root's credentials, which the tests' host-side attaches carry.
fn root() -> xemem::Credentials {
    xemem::Credentials { uid: 0, groups: vec![0] }
}

/// The id of the segment named `name`, once its owner has made it (5 s at most).
fn wait_for_segment(links: &clowderd::xemem::XememLinks, name: &str) -> xemem::ids::SegmentId {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match links.lookup(name) {
            Ok(segment) => return segment,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{name}: {e:?}"),
        }
    }
}

/// Maps every file range of an attach of the fake owner's segment and checks that page `n`
/// reads `1000 + n`, as the fake job wrote into its frames.
fn assert_reads_the_fake_segment(runs: &[clowderd::xemem::FileRun]) {
    let expected: Vec<u64> = (1000..1000 + SEGMENT_PAGES).collect();
    assert_eq!(support::MappedRuns::new(runs).first_words(), expected, "each page reads the enclave's frame");
}

/// The daemon keeps an owner enclave's frames for an attach while the owner kernel's published
/// count of page-table changes stays put: attaching the same range again maps the same frames
/// without asking the owner's kernel (slow to run on this machine); once the count moves, the
/// owner is asked again.
#[test]
fn an_owner_enclave_is_asked_again_only_after_its_mappings_changed() {
    let (daemon, work, links) = xemem_owner_daemon("xemem-owner-runs", "owner-runs-kept");
    std::thread::scope(|scope| {
        let owner = scope.spawn(|| daemon.run("owner-runs-kept", &["prog", "xemem-owner", "honest", "2"], &work.0, &[]));
        let segment = wait_for_segment(&links, "fake-seg-honest");
        let hardware = fake_hardware("owner-runs-kept");
        let resolves = || hardware.xemem_resolves.load(Ordering::SeqCst);
        let attach_and_check = || {
            let (access, runs) = links.attach_enclave_segment(4242, root(), segment, 0, SEGMENT_PAGES * 4096).expect("attach");
            assert_reads_the_fake_segment(&runs);
            access
        };
        for attach in 1..=3 {
            let access = attach_and_check();
            assert_eq!(resolves(), 1, "attach {attach}: only the first asks the owner; nothing changed since");
            links.release(4242, access).expect("release");
        }
        hardware.count_mapping_change();
        let access = attach_and_check();
        assert_eq!(resolves(), 2, "a mapping changed: the owner is asked again");
        // Its second resolve ends the owner's job, which removes the segment and the permits
        // on it: the release finds the permit, or finds it gone (ENOENT, as XPMEM).
        let released = links.release(4242, access);
        assert!(matches!(released, Ok(()) | Err(xemem::Error::NotFound)), "{released:?}");
        let (reply, stdout, _) = owner.join().unwrap();
        assert_eq!(reply["status"], 0, "{reply}");
        assert_eq!(stdout, "made and served\n");
    });
}

/// An enclave's segment attached for a host process: the owner answers with guest-physical
/// frame runs, the daemon checks each against the enclave's RAM and hands out ranges of the
/// RAM memfd, which map the enclave's very pages (no copy). Runs outside RAM or over the
/// channel fail the attach with EINVAL.
#[test]
fn a_host_process_maps_an_enclave_segment_through_the_ram_memfd() {
    let (daemon, work, links) = xemem_owner_daemon("xemem-attach", "owner");
    let lookup = |name: &str| wait_for_segment(&links, name);
    std::thread::scope(|scope| {
        let owner = scope.spawn(|| daemon.run("owner", &["prog", "xemem-owner", "honest"], &work.0, &[]));
        let segment = lookup("fake-seg-honest");
        assert!(segment.enclave() >= 2, "an enclave's segment names its enclave: {segment:?}");
        // `clowder xemem ls` lists the enclave's segment beside the host's.
        let broker_socket = work.0.join("xemem.sock");
        assert!(daemon.daemon.host_xemem(clowderd::xemem::service::start(&broker_socket).unwrap()).is_ok());
        let listing = daemon.call(json!({"op": "xemem_ls"}));
        let listed = listing["segments"].as_array().unwrap_or_else(|| panic!("{listing}"));
        assert!(
            listed.iter().any(|s| s["name"] == "fake-seg-honest" && s["owner_enclave"] == segment.enclave() && s["size"] == 16 * 4096),
            "{listing}"
        );
        let (access, runs) = links.attach_enclave_segment(4242, root(), segment, 0, 16 * 4096).expect("attach");
        assert_eq!(runs.len(), 2, "one file range per frame run: {runs:?}");
        assert_reads_the_fake_segment(&runs);
        // The owner's job ends once it has served, and its end removes the segment and the
        // permits on it: the release finds the permit, or finds it gone (ENOENT, as XPMEM).
        let released = links.release(4242, access);
        assert!(matches!(released, Ok(()) | Err(xemem::Error::NotFound)), "{released:?}");
        let (reply, stdout, _) = owner.join().unwrap();
        assert_eq!(reply["status"], 0, "{reply}");
        assert_eq!(stdout, "made and served\n");
    });
    for lie in ["outside", "channel"] {
        std::thread::scope(|scope| {
            let owner = scope.spawn(|| daemon.run("owner", &["prog", "xemem-owner", lie], &work.0, &[]));
            let segment = lookup(&format!("fake-seg-{lie}"));
            let refused = links.attach_enclave_segment(4242, root(), segment, 0, 16 * 4096);
            assert_eq!(refused.err(), Some(xemem::Error::Invalid), "{lie}: frames that are not the enclave's RAM");
            owner.join().unwrap();
        });
    }
    // The daemon survived all of it.
    let (reply, stdout, _) = daemon.run("owner", &["prog", "echo", "still", "here"], &work.0, &[]);
    assert_eq!(reply["status"], 0);
    assert_eq!(stdout, "still here\n");
}

#[test]
fn the_api_answers_its_version_and_types_every_error() {
    let daemon = start_daemon("typed", Liveness::default());
    let version = daemon.call(json!({"op": "version"}));
    assert_eq!(version["ok"], true, "{version}");
    assert_eq!(version["api_version"], clowder_api::API_VERSION, "{version}");
    assert_eq!(version["daemon_version"], env!("CARGO_PKG_VERSION"), "{version}");
    // Each error names what is wrong and says what kind of error it is.
    let expect = |request: Value, kind: &str, words: &str| {
        let reply = daemon.call(request);
        assert_eq!((&reply["ok"], &reply["kind"]), (&json!(false), &json!(kind)), "{reply}");
        assert!(reply["error"].as_str().unwrap().contains(words), "{reply}");
    };
    expect(json!({"op": "create", "name": "a", "mem": "16M", "cor": 1}), "invalid_argument", "unknown field `cor`");
    expect(json!({"op": "rm", "name": 7}), "invalid_argument", "`name`");
    expect(json!({"op": "ls", "verbose": true}), "invalid_argument", "unknown field `verbose`");
    expect(json!({"op": "version", "client": 1}), "invalid_argument", "`version`");
    expect(json!({"op": "rm", "name": "nope"}), "not_found", "no enclave named nope");
    daemon.create("twice");
    expect(json!({"op": "create", "name": "twice", "cores": 1, "mem": "16M"}), "already_exists", "already exists");
    expect(json!({"op": "xemem_ls"}), "unavailable", "without an XEMEM broker");
    // The typed client reads the same replies.
    let listed: clowder_api::daemon::LsReply = daemon.client().request(&clowder_api::daemon::Request::Ls).unwrap();
    assert_eq!(listed.enclaves.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["twice"]);
}
