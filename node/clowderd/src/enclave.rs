//! A persistent enclave: a machine running the LWK, the host end of its channel, and the jobs
//! running in it. One pump thread per enclave receives everything the kernel sends, serves
//! forwarded file calls, pings the kernel, and notices when the machine ends.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use enclave_proto::{EnclaveMessage, FileImage, FileOp, HostMessage, LaunchJob, List, Stream, PROTOCOL_VERSION};

use crate::console::LogBook;
use crate::file_slots::Slots;
use crate::guest_ram::GuestRam;
use crate::hio::{Identity, JobFiles, Scope};
use crate::link::{self, Received, Receiver, Sender};
use crate::machine::{Launcher, Machine, MachineSpec, Populated, RegionAccess, SharedRegion};
use crate::sockets::{HelperSpec, JobSockets, UserLimits};
use crate::sys;
use crate::xemem::{EnclaveUser, GuestRegions, XememLinks, XememPort};

mod ping;
mod shared_files;

/// Timing of the liveness checks.
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    /// How long a new kernel may take to say `Hello`.
    pub hello_timeout: Duration,
    pub ping_interval: Duration,
    /// A `Ping` unanswered this long means the enclave hangs (the time its first vCPU waited
    /// for a host CPU does not count: `ping`).
    pub ping_timeout: Duration,
}

/// The ping timeout is 30 s: the LWK answers on CPU 0 between pieces of kernel work, and a
/// long one (loading a large dynamic program, a job mapping tens of MiB) is emulated on PVM
/// hosts, where a loaded machine stretched it past 5 s and an enclave was removed while alive.
impl Default for Liveness {
    fn default() -> Self {
        Liveness { hello_timeout: Duration::from_secs(10), ping_interval: Duration::from_secs(1), ping_timeout: Duration::from_secs(30) }
    }
}

/// What a job's client hears.
#[derive(Debug, PartialEq, Eq)]
pub enum JobEvent {
    Started,
    Output {
        stream: Stream,
        data: Vec<u8>,
    },
    Exited {
        status: u32,
    },
    /// The job could not start, or its enclave went away under it.
    Failed {
        reason: String,
    },
}

/// A file for the job: its name in the enclave and its contents on the host.
pub struct JobFile {
    pub name: String,
    pub file: File,
}

pub struct JobSpec {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    /// The working directory as a host path, and a descriptor of it.
    pub cwd: String,
    pub cwd_dir: File,
    /// The launching user: forwarded file calls run with their rights.
    pub owner: Identity,
    /// Which of the host's files the job may name.
    pub scope: Scope,
    /// Mask of the enclave's vCPUs the job may use (0: all).
    pub cores: u64,
    pub heap: u64,
    pub binary: JobFile,
    pub inputs: Vec<JobFile>,
    /// The launching client's descriptor limit, which the job's sockets live under.
    pub limits: UserLimits,
    /// The launching client's pid (0: unknown): an LWK gives it to the job's first process
    /// (`LaunchJob::pid`).
    pub launcher: u32,
}

struct JobSlot {
    events: mpsc::Sender<JobEvent>,
    /// The launching user's uid: jobs that share an enclave share its kernel's file system
    /// and memory left by ended processes, so they are one user's.
    uid: u32,
    files: JobFiles,
    regions: Vec<SharedRegion>,
    /// Host files the job maps shared (`shared_files`); they go when it ends.
    mapped: Vec<shared_files::MappedFile>,
    sockets: JobSockets,
}

pub struct Enclave {
    pub name: String,
    pub cores: Vec<usize>,
    pub memory: u64,
    pub hugepages: bool,
    pub created: SystemTime,
    pub pid: Option<u32>,
    pub log: Arc<LogBook>,
    pub kernel_vcpus: u16,
    machine: Mutex<Box<dyn Machine>>,
    /// Shared with the relays of the jobs' socket helpers (`sockets`).
    sender: Arc<Mutex<Sender>>,
    ram: Arc<GuestRam>,
    jobs: Mutex<HashMap<u32, JobSlot>>,
    /// Regions of jobs that ended while others ran: the kernel's file system of the jobs'
    /// files still names them (and another job may run those files), so they go with the
    /// last running job.
    retired_regions: Mutex<Vec<SharedRegion>>,
    stopping: AtomicBool,
    /// Held while a finished job's XEMEM segments are revoked, and by every launch: the next
    /// job's memory is never visible through the last one's attachments.
    launch_gate: Mutex<()>,
    /// Regions of other enclaves' published words (read-only), as logged apart from memory.
    word_regions: Mutex<Vec<u32>>,
    /// The kernel's file-call slots, once it published them (`FileSlots`), and whether to
    /// serve them (decided when the enclave starts).
    file_slots: OnceLock<Slots>,
    serves_file_slots: bool,
}

/// Turns the tail of an enclave's log into an indented block for error messages.
pub fn log_excerpt(log: &LogBook) -> String {
    let tail = log.tail(8);
    if tail.is_empty() {
        return String::new();
    }
    format!("\nlast log lines:\n  {}", tail.join("\n  "))
}

fn page_align(length: u64) -> u64 {
    length.div_ceil(4096).max(1) * 4096
}

impl Enclave {
    /// Starts the machine, attaches to its channel and waits for the kernel's `Hello`. Returns
    /// the enclave and the receiving end, which [`Enclave::pump`] consumes. `progress` hears how
    /// far populating the machine's memory got.
    pub fn start(
        spec: MachineSpec,
        launcher: &dyn Launcher,
        liveness: Liveness,
        log: Arc<LogBook>,
        progress: &mut dyn FnMut(Populated),
    ) -> Result<(Arc<Enclave>, Receiver), String> {
        let mut machine = launcher.launch(&spec, log.clone(), progress)?;
        let fail = |machine: &mut Box<dyn Machine>, why: String| {
            let ended = machine.shut_down(Duration::from_secs(1));
            format!("{why} ({ended}){}", log_excerpt(&log))
        };
        let parts = match machine.channel() {
            Ok(parts) => parts,
            Err(e) => return Err(fail(&mut machine, format!("cannot reach the enclave channel: {e}"))),
        };
        let (sender, mut receiver, ram) = match link::attach(parts) {
            Ok(ends) => ends,
            Err(e) => return Err(fail(&mut machine, e)),
        };
        let deadline = Instant::now() + liveness.hello_timeout;
        let vcpus = loop {
            if let Some(ended) = machine.ended() {
                return Err(format!(
                    "the enclave ended before its kernel answered on the channel: {ended}; a kernel that does not speak \
                     the enclave protocol yet can still run jobs one-shot (clowder run without --enclave){}",
                    log_excerpt(&log)
                ));
            }
            if Instant::now() > deadline {
                return Err(fail(
                    &mut machine,
                    format!("the kernel did not say Hello on the channel within {} ms", liveness.hello_timeout.as_millis()),
                ));
            }
            match receiver.receive(Duration::from_millis(20)) {
                Ok(Received::Message(bytes)) => match EnclaveMessage::decode(&bytes) {
                    Ok(EnclaveMessage::Hello { version, vcpus, .. }) if version == PROTOCOL_VERSION => break vcpus,
                    Ok(EnclaveMessage::Hello { version, .. }) => {
                        return Err(fail(
                            &mut machine,
                            format!("the kernel speaks enclave protocol version {version}, clowderd speaks {PROTOCOL_VERSION}"),
                        ))
                    }
                    Ok(EnclaveMessage::Log { text }) => log.push(format!("[lwk] {}", String::from_utf8_lossy(text))),
                    Ok(other) => log.push(format!("clowderd: {other:?} before Hello; ignored")),
                    Err(e) => log.push(format!("clowderd: malformed message from the enclave ({e}); ignored")),
                },
                Ok(Received::Nothing) => {}
                Ok(Received::BadFrame(e)) => log.push(format!("clowderd: malformed frame from the enclave ({e}); ignored")),
                Err(e) => return Err(fail(&mut machine, e)),
            }
        };
        log.push(format!("clowderd: enclave {} is ready ({vcpus} vCPUs)", spec.name));
        let enclave = Enclave {
            name: spec.name,
            cores: spec.cores,
            memory: spec.memory,
            hugepages: spec.hugepages,
            created: SystemTime::now(),
            pid: machine.pid(),
            log,
            kernel_vcpus: vcpus,
            machine: Mutex::new(machine),
            sender: Arc::new(Mutex::new(sender)),
            ram,
            jobs: Mutex::new(HashMap::new()),
            retired_regions: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            launch_gate: Mutex::new(()),
            word_regions: Mutex::new(Vec::new()),
            file_slots: OnceLock::new(),
            serves_file_slots: Slots::wanted(),
        };
        Ok((Arc::new(enclave), receiver))
    }

    /// The machine's RAM (a Linux enclave's XEMEM device resolves exports in it).
    pub fn ram(&self) -> Arc<GuestRam> {
        self.ram.clone()
    }

    pub fn running_jobs(&self) -> usize {
        self.jobs.lock().unwrap().len()
    }

    fn send(&self, message: &HostMessage<'_>) -> Result<(), String> {
        self.sender.lock().unwrap().send(message)
    }

    /// One XEMEM message for the enclave (a Linux guest's agent takes `xemem::pci::GuestEvent`s).
    pub fn send_xemem(&self, message: &[u8]) -> Result<(), String> {
        self.send(&HostMessage::Xemem { message })
    }

    /// Copies a file into a fresh memfd and shares it into the enclave.
    fn share_file(&self, file: &JobFile) -> Result<(SharedRegion, u64), String> {
        let mut source = &file.file;
        source.seek(SeekFrom::Start(0)).map_err(|e| format!("reading {}: {e}", file.name))?;
        let mut copy = sys::memfd(&format!("clowder-{}", file.name)).map_err(|e| format!("memfd: {e}"))?;
        let length = std::io::copy(&mut source, &mut copy).map_err(|e| format!("copying {}: {e}", file.name))?;
        let region_len = page_align(length);
        copy.set_len(region_len).map_err(|e| format!("sizing the copy of {}: {e}", file.name))?;
        let region = self.machine.lock().unwrap().add_region(&copy, region_len)?;
        Ok((region, length))
    }

    fn release_regions(&self, regions: &[SharedRegion]) {
        let mut machine = self.machine.lock().unwrap();
        for region in regions {
            if let Err(e) = machine.remove_region(region.slot) {
                self.log.push(format!("clowderd: removing region {} from the enclave: {e}", region.slot));
            }
        }
    }

    /// Shares the job's files with the enclave and sends `LaunchJob`; events arrive on `events`.
    pub fn launch(&self, job: u32, spec: JobSpec, events: mpsc::Sender<JobEvent>) -> Result<(), String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(format!("enclave {} is shutting down", self.name));
        }
        let mut regions = Vec::new();
        let mut images = Vec::new();
        for file in std::iter::once(&spec.binary).chain(&spec.inputs) {
            match self.share_file(file) {
                Ok((region, len)) => {
                    regions.push(region);
                    images.push((file.name.as_bytes(), region.gpa, len));
                }
                Err(e) => {
                    self.release_regions(&regions);
                    return Err(e);
                }
            }
        }
        let images: Vec<FileImage> = images.iter().map(|&(name, gpa, len)| FileImage { name, gpa, len }).collect();
        let argv: Vec<&[u8]> = spec.argv.iter().map(|a| a.as_bytes()).collect();
        let env: Vec<&[u8]> = spec.env.iter().map(|e| e.as_bytes()).collect();
        let message = HostMessage::LaunchJob(LaunchJob {
            job,
            argv: List::new(&argv),
            env: List::new(&env),
            cwd: spec.cwd.as_bytes(),
            cores: spec.cores,
            heap_size: spec.heap,
            stack_size: 0,
            binary: images[0],
            files: List::new(&images[1..]),
            pid: spec.launcher.into(),
        });
        let uid = spec.owner.uid;
        let sockets = JobSockets::new(HelperSpec { job, owner: spec.owner.clone(), limits: spec.limits, cwd: spec.cwd.clone() });
        let files = JobFiles::new(spec.cwd_dir, spec.cwd.clone(), spec.scope, spec.owner);
        let _gate = self.launch_gate.lock().unwrap();
        {
            let mut jobs = self.jobs.lock().unwrap();
            if jobs.values().any(|other| other.uid != uid) {
                drop(jobs);
                self.release_regions(&regions);
                return Err(format!(
                    "enclave {} runs another user's job; jobs of different users do not share an enclave (try again when it ends)",
                    self.name
                ));
            }
            jobs.insert(job, JobSlot { events, uid, files, regions: regions.clone(), mapped: Vec::new(), sockets });
        }
        if let Err(e) = self.send(&message) {
            self.jobs.lock().unwrap().remove(&job);
            self.release_regions(&regions);
            return Err(e);
        }
        // The arguments are the job owner's to read.
        self.log.push_private(uid, format!("clowderd: launched job {job}: {}", spec.argv.join(" ")));
        Ok(())
    }

    pub fn kill_job(&self, job: u32) {
        if self.jobs.lock().unwrap().contains_key(&job) {
            if let Err(e) = self.send(&HostMessage::KillJob { job }) {
                self.log.push(format!("clowderd: could not send KillJob {job}: {e}"));
            }
        }
    }

    /// Ends a job's slot: its files close and its shared regions go (with the last running
    /// job's, see `retired_regions`).
    fn finish_job(&self, job: u32, event: JobEvent) {
        let (slot, last) = {
            let mut jobs = self.jobs.lock().unwrap();
            let slot = jobs.remove(&job);
            (slot, jobs.is_empty())
        };
        if let Some(JobSlot { events, regions, mapped, sockets, .. }) = slot {
            // The job's host sockets close (its helper ends) before the client hears the end,
            // as a Linux process's are closed when its parent sees it exit: a launcher that
            // waits for `clowder run` then finds the rank's last bytes and their end there.
            // (A job's sends are answered only once written, so none is pending by now.)
            drop(sockets);
            let _ = events.send(event);
            let mut retired = self.retired_regions.lock().unwrap();
            retired.extend(regions.iter().copied().chain(mapped.iter().map(|mapped| mapped.region)));
            if last {
                self.release_regions(&std::mem::take(&mut *retired));
            }
        }
    }

    fn forward(&self, job: u32, event: JobEvent) {
        match self.jobs.lock().unwrap().get(&job) {
            Some(slot) => {
                let _ = slot.events.send(event);
            }
            None => self.log.push(format!("clowderd: the enclave reported {event:?} for unknown job {job}; ignored")),
        }
    }

    /// Raises the channel interrupt (a file slot answered for a halted kernel).
    pub fn kick(&self) {
        self.sender.lock().unwrap().kick();
    }

    /// Serves a forwarded file call of `job` (from the channel or a file slot): the reply.
    pub fn serve_file_request(&self, job: u32, request: u32, op: &FileOp<'_>) -> HostMessage<'static> {
        let mut jobs = self.jobs.lock().unwrap();
        match jobs.get_mut(&job) {
            Some(slot) => {
                // Before the answer: a job that learns of a truncation from the host (a stat)
                // has had its pages past the end taken (the pump alone looks only between
                // bursts of file calls).
                let gone = self.truncated_tails(job, slot);
                if let Err(e) = self.send_truncated_tails(gone) {
                    self.log.push(format!("clowderd: job {job}: could not tell the kernel of a truncated file: {e}"));
                }
                if let Some(result) = self.serve_shared_mapping(job, slot, op) {
                    return HostMessage::FileResult { job, request, result };
                }
                let served = slot.files.serve(op, &self.ram);
                if let Some(refusal) = &served.refusal {
                    self.log.push(format!("clowderd: job {job}: refused {op:?}: {refusal}"));
                }
                served.reply(job, request)
            }
            None => HostMessage::FileResult { job, request, result: -(libc::ESRCH as i64) },
        }
    }

    /// Handles one message; an error means the enclave is finished.
    fn handle(&self, bytes: &[u8], outstanding_ping: &mut Option<ping::PendingPing>, xemem: Option<&XememPort>) -> Result<(), String> {
        let message = match EnclaveMessage::decode(bytes) {
            Ok(message) => message,
            Err(e) => {
                self.log.push(format!("clowderd: malformed message from the enclave ({e}); ignored"));
                return Ok(());
            }
        };
        match message {
            EnclaveMessage::Hello { .. } => self.log.push("clowderd: a second Hello from the enclave; ignored"),
            EnclaveMessage::Pong { nonce } => {
                if outstanding_ping.as_ref().is_some_and(|ping| ping.nonce == nonce) {
                    *outstanding_ping = None;
                }
            }
            EnclaveMessage::JobStarted { job } => self.forward(job, JobEvent::Started),
            EnclaveMessage::JobOutput { job, stream, data } => self.forward(job, JobEvent::Output { stream, data: data.to_vec() }),
            EnclaveMessage::JobExited { job, status } => {
                self.log.push(match enclave_proto::job_status_signal(status) {
                    // As a shell would show it, with what it means.
                    Some(signal) => format!("clowderd: job {job} exited with status {} (killed by signal {signal})", 128 + signal),
                    None => format!("clowderd: job {job} exited with status {status}"),
                });
                // No job starts here until the finished job's segments are revoked everywhere;
                // beside other jobs its processes' segments went as each ended (the kernel's
                // removes), and the enclave's others are theirs.
                let _gate = self.launch_gate.lock().unwrap();
                let last = self.jobs.lock().unwrap().keys().all(|&other| other == job);
                if let (Some(port), true) = (xemem, last) {
                    port.job_ended();
                }
                self.finish_job(job, JobEvent::Exited { status });
            }
            EnclaveMessage::LaunchFailed { job, errno, reason } => {
                let reason = format!("the enclave could not start the job: {} (errno {errno})", String::from_utf8_lossy(reason));
                self.log.push(format!("clowderd: job {job}: {reason}"));
                self.finish_job(job, JobEvent::Failed { reason });
            }
            EnclaveMessage::Log { text } => self.log.push(format!("[lwk] {}", String::from_utf8_lossy(text))),
            EnclaveMessage::Panic { text } => return Err(format!("the LWK panicked: {}", String::from_utf8_lossy(text))),
            EnclaveMessage::FileRequest { job, request, op } => {
                let reply = self.serve_file_request(job, request, &op);
                self.send(&reply)?;
            }
            EnclaveMessage::ZeroMemory { request, gpa, len } => {
                let result = if gpa % 4096 != 0 || len % 4096 != 0 {
                    -libc::EINVAL
                } else if let Err(e) = self.ram.zero(gpa, len) {
                    self.log.push(format!("clowderd: refused to clear enclave memory: {e}"));
                    -libc::EFAULT
                } else {
                    0
                };
                self.send(&HostMessage::MemoryZeroed { request, result })?;
            }
            EnclaveMessage::SocketRequest { job, request, op } => {
                let forwarded = match self.jobs.lock().unwrap().get_mut(&job) {
                    Some(slot) => slot.sockets.forward(bytes, &self.ram, &self.sender),
                    None => Err((libc::ESRCH, format!("a socket call for unknown job {job}"))),
                };
                // Close has no answer.
                if let (Err((errno, why)), false) = (forwarded, matches!(op, enclave_proto::SocketOp::Close { .. })) {
                    self.log.push(format!("clowderd: job {job}: {why}"));
                    self.send(&HostMessage::SocketResult { job, request, result: -(errno as i64), events: 0, data: &[] })?;
                }
            }
            EnclaveMessage::FileSlots { .. } if self.file_slots.get().is_some() => {
                self.log.push("clowderd: the kernel published its file slots a second time; ignored")
            }
            EnclaveMessage::FileSlots { .. } if !self.serves_file_slots => {
                self.log.push("clowderd: CLOWDER_FILE_SLOTS=off: file calls take the channel")
            }
            EnclaveMessage::FileSlots { gpa, count } => match Slots::map(&self.ram, gpa, count) {
                Ok(slots) => {
                    let _ = self.file_slots.set(slots);
                }
                Err(e) => self.log.push(format!("clowderd: refused the kernel's file slots: {e}")),
            },
            EnclaveMessage::MappingCounter { gpa } => {
                if let Err(e) = self.ram.publish_mapping_counter(gpa) {
                    self.log.push(format!("clowderd: refused the kernel's mapping counter: {e}"));
                }
            }
            EnclaveMessage::Xemem { message } => match xemem {
                Some(port) => port.from_enclave(message, self),
                None => self.log.push("clowderd: an XEMEM message from the enclave, but XEMEM has no link to it; ignored"),
            },
        }
        Ok(())
    }

    /// Runs until the enclave is stopped ([`Enclave::stop`], returns `None`) or fails (returns
    /// why): its machine ended, it stopped answering pings, it corrupted the channel or it
    /// panicked. On failure every job hears why and the machine is shut down.
    /// `user` owns the enclave: its processes' XEMEM segments and gets are that user's.
    pub fn pump(
        self: &Arc<Self>,
        mut receiver: Receiver,
        liveness: Liveness,
        xemem: &Arc<XememLinks>,
        user: EnclaveUser,
    ) -> Option<String> {
        // The enclave's XEMEM link lives as long as this pump: dropping it takes the link down.
        let machine: Arc<dyn GuestRegions + Send + Sync> = self.clone();
        let xemem =
            receiver.waker().ok().and_then(|wake| xemem.join_enclave(self.ram.clone(), wake, machine)).map(|port| port.for_user(user));
        if xemem.is_none() {
            self.log.push("clowderd: no XEMEM link left for this enclave");
        }
        let mut outstanding_ping: Option<ping::PendingPing> = None;
        let mut first_vcpu = ping::FirstVcpu::of(self.machine.lock().unwrap().pid());
        let mut next_ping = Instant::now() + liveness.ping_interval;
        let mut next_truncation_check = Instant::now();
        let mut nonce = 0u64;
        let failure = loop {
            if self.stopping.load(Ordering::SeqCst) {
                return None;
            }
            if let Some(ended) = self.machine.lock().unwrap().ended() {
                break format!("its machine ended: {ended}");
            }
            let now = Instant::now();
            if outstanding_ping.is_none() && now >= next_ping {
                nonce += 1;
                if let Err(e) = self.send(&HostMessage::Ping { nonce }) {
                    break format!("it stopped draining its channel: {e}");
                }
                outstanding_ping = Some(ping::PendingPing::sent(nonce, &mut first_vcpu));
                next_ping = now + liveness.ping_interval;
            }
            if now >= next_truncation_check {
                if let Err(e) = self.report_truncated_files() {
                    break format!("it stopped draining its channel: {e}");
                }
                next_truncation_check = now + shared_files::TRUNCATION_CHECK;
            }
            // The channel is read before the Ping is judged: when this thread was starved (a
            // loaded host), the Pong, or the corruption that explains the silence, is already
            // waiting there. Only an empty channel, or a Pong owed for far too long while the
            // enclave keeps sending other things, makes it hung.
            // While the pump polls the file slots the kernel rings no doorbell for them: the
            // channel is only looked at, and the slots polled again at once.
            let wait = if self.file_slots.get().is_some_and(Slots::polling) { Duration::ZERO } else { Duration::from_millis(20) };
            let received = receiver.receive(wait);
            // A doorbell may have been for the file slots. Their polling stops for a message
            // in hand, or one that comes on the channel (or wakes the pump) meanwhile.
            if let Some(slots) = self.file_slots.get() {
                let answer = |job, request, op: &FileOp<'_>| self.serve_file_request(job, request, op);
                let in_hand = matches!(received, Ok(Received::Message(_)));
                slots.serve(&self.ram, &self.log, &answer, &|| self.kick(), &mut || in_hand || receiver.waiting());
            }
            let channel_empty = match received {
                Ok(Received::Message(bytes)) => {
                    if let Err(e) = self.handle(&bytes, &mut outstanding_ping, xemem.as_ref()) {
                        break e;
                    }
                    false
                }
                Ok(Received::Nothing) => true,
                Ok(Received::BadFrame(e)) => {
                    self.log.push(format!("clowderd: malformed frame from the enclave ({e}); ignored"));
                    false
                }
                Err(e) => break e,
            };
            if let Some(pending) = &outstanding_ping {
                let timeout = if channel_empty { liveness.ping_timeout } else { liveness.ping_timeout * 4 };
                if let Some(silent) = pending.unanswered(&mut first_vcpu, timeout) {
                    break format!("it stopped answering Ping (no Pong for {} ms)", silent.as_millis());
                }
            }
            if let Some(port) = &xemem {
                port.tick(&**self);
                let mut failed = None;
                for message in port.to_enclave() {
                    if let Err(e) = self.send(&HostMessage::Xemem { message: &message }) {
                        failed = Some(e);
                        break;
                    }
                }
                if let Some(e) = failed {
                    break format!("it stopped draining its channel: {e}");
                }
            }
        };
        if let Some(slots) = self.file_slots.get() {
            slots.stop();
        }
        self.log.push(format!("clowderd: enclave {} failed: {failure}", self.name));
        let ended = self.machine.lock().unwrap().shut_down(Duration::from_secs(1));
        self.log.push(format!("clowderd: {ended}"));
        self.abandon_jobs(&format!("enclave {} failed: {failure}", self.name));
        Some(failure)
    }

    fn abandon_jobs(&self, reason: &str) {
        let slots: Vec<JobSlot> = self.jobs.lock().unwrap().drain().map(|(_, slot)| slot).collect();
        for slot in slots {
            let _ = slot.events.send(JobEvent::Failed { reason: reason.to_string() });
        }
    }

    /// Asks the kernel to shut down, then stops the machine. The pump returns `None` after this.
    pub fn stop(&self) -> String {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.send(&HostMessage::Shutdown);
        self.abandon_jobs(&format!("enclave {} was removed", self.name));
        // Give the kernel a moment to end its jobs and stop the machine itself.
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline && self.machine.lock().unwrap().ended().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let ended = self.machine.lock().unwrap().shut_down(Duration::from_secs(2));
        self.log.push(format!("clowderd: enclave {} removed: {ended}", self.name));
        ended
    }
}

/// XEMEM attaches of host memory become regions of this enclave's machine.
impl GuestRegions for Enclave {
    fn add(&self, file: &std::fs::File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String> {
        let added = self.machine.lock().unwrap().add_region_range(file, offset, len, access);
        let what = match access {
            RegionAccess::ReadWrite => "host memory",
            RegionAccess::ReadOnly => "another enclave's count of page-table changes, read-only,",
        };
        match &added {
            Ok(region) => {
                if access == RegionAccess::ReadOnly {
                    self.word_regions.lock().unwrap().push(region.slot);
                }
                self.log.push(format!("clowderd: xemem: {what} ({len:#x} bytes) is region {} at {:#x}", region.slot, region.gpa))
            }
            Err(e) => self.log.push(format!("clowderd: xemem: adding {what} ({len:#x} bytes) as a region: {e}")),
        }
        added
    }
    fn add_pieces(&self, file: &std::fs::File, pieces: &[clowder_api::vmm::Piece]) -> Option<Result<SharedRegion, String>> {
        let added = self.machine.lock().unwrap().add_region_pieces(file, pieces)?;
        let len = pieces.iter().fold(0u64, |len, piece| len.saturating_add(piece.len));
        match &added {
            Ok(region) => self.log.push(format!(
                "clowderd: xemem: host memory ({len:#x} bytes in {} pieces) is region {} at {:#x}",
                pieces.len(),
                region.slot,
                region.gpa
            )),
            Err(e) => {
                self.log.push(format!("clowderd: xemem: adding host memory ({len:#x} bytes in {} pieces) as a region: {e}", pieces.len()))
            }
        }
        Some(added)
    }
    fn remove(&self, slot: u32) -> Result<(), String> {
        let removed = self.machine.lock().unwrap().remove_region(slot);
        let word = {
            let mut words = self.word_regions.lock().unwrap();
            let known = words.contains(&slot);
            words.retain(|&other| other != slot);
            known
        };
        let what = if word { "read-only region" } else { "host memory region" };
        match &removed {
            Ok(()) => self.log.push(format!("clowderd: xemem: {what} {slot} removed")),
            Err(e) => self.log.push(format!("clowderd: xemem: removing {what} {slot}: {e}")),
        }
        removed
    }
}
