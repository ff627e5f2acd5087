//! The fake enclave's guest side: a tiny kernel that speaks `enclave-proto` over the channel
//! (Hello, Ping, forwarded file calls, XEMEM through its own node) and runs the scripted jobs
//! of [`scripts`].

mod scripts;

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clowder_channel::Endpoint;
use clowderd::sys;
use enclave_proto::slots;
use enclave_proto::{EnclaveMessage, FileOp, Fragmenter, HostMessage, Reassembler, Stream, MAX_MESSAGE_LEN, PROTOCOL_VERSION};

use super::{FakeHardware, CHANNEL_GPA, COUNTER_GPA, RAM_SIZE, SEGMENT_GPA, SEGMENT_PAGES, SEGMENT_VADDR, SLOTS_GPA, START};

/// The guest side: a tiny kernel that runs scripted "jobs" chosen by argv[1].
pub(super) struct FakeKernel {
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

/// Where the fake job's exported memory claims to live: RAM at `SEGMENT_GPA..`, or frames
/// the enclave may not hand out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backing {
    Ram,
    OutsideRam,
    Channel,
}

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
    pub(super) fn new(hardware: Arc<FakeHardware>, endpoint: Endpoint, vcpus: u16) -> FakeKernel {
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

    pub(super) fn run(mut self) {
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

    /// The little-endian word at `gpa`.
    fn ram_word(&self, gpa: u64) -> u64 {
        let mut word = [0u8; 8];
        self.hardware.ram.read(gpa, &mut word).unwrap();
        u64::from_le_bytes(word)
    }

    /// Publishes one file slot at `SLOTS_GPA`, as the LWK does after `Hello`, and waits (5 s
    /// at most) until the host says it serves it.
    fn publish_slots(&mut self) -> bool {
        self.send(EnclaveMessage::FileSlots { gpa: SLOTS_GPA, count: 1 });
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.ram_word(SLOTS_GPA + slots::HOST_READY) == 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// A forwarded file call through the file slot, posted as the LWK posts one (the doorbell
    /// only if the host is not polling); waits for its answer, 5 s at most.
    fn slot_call(&mut self, job: u32, op: FileOp) -> (i64, Option<u64>) {
        let request = self.next_request;
        self.next_request += 1;
        let slot = slots::slot_address(SLOTS_GPA, 0);
        let mut bytes = vec![0u8; slots::DATA_CAPACITY];
        let length = EnclaveMessage::FileRequest { job, request, op }.encode(&mut bytes).unwrap();
        let ram = &self.hardware.ram;
        ram.write(slot + slots::DATA, &bytes[..length]).unwrap();
        ram.write(slot + slots::LENGTH, &(length as u64).to_le_bytes()).unwrap();
        ram.write(slot + slots::STATE, &slots::POSTED.to_le_bytes()).unwrap();
        // The post before the look at the host's flag, as the protocol's sequentially
        // consistent accesses have it.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.ram_word(SLOTS_GPA + slots::HOST_POLLING) == 0 {
            sys::signal_eventfd(&self.hardware.doorbell).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.ram_word(slot + slots::STATE) != slots::ANSWERED {
            if Instant::now() > deadline {
                return (-1, None);
            }
            std::thread::sleep(Duration::from_micros(10));
        }
        let mut answer = vec![0u8; (self.ram_word(slot + slots::LENGTH) as usize).min(slots::DATA_CAPACITY)];
        self.hardware.ram.read(slot + slots::DATA, &mut answer).unwrap();
        self.hardware.ram.write(slot + slots::STATE, &slots::FREE.to_le_bytes()).unwrap();
        match HostMessage::decode(&answer) {
            Ok(HostMessage::FileResult { request: answered, result, .. }) if answered == request => (result, None),
            Ok(HostMessage::FileAttributes { request: answered, attributes, .. }) if answered == request => (0, Some(attributes.size)),
            _ => (-1, None),
        }
    }

    fn region_bytes(&self, gpa: u64, len: u64) -> Vec<u8> {
        let regions = self.hardware.regions.lock().unwrap();
        let file = regions.get(&gpa).expect("the daemon shared this region");
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }
}
