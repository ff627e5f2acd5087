//! Persistent enclaves: the guest side of `enclave-proto` (see that crate's docs for the
//! protocol and `docs/lwk-syscalls.md` for what a job sees).
//!
//! Booted without a job module but with a channel on its command line (`clowder.channel=`,
//! as `clowderd` starts it), the kernel attaches the channel, says `Hello`, and serves the
//! host from a loop on CPU 0: `Ping` gets `Pong`, `LaunchJob` loads and runs a job, `KillJob`
//! ends it, `Shutdown` stops the machine. While a job runs its stdout and stderr writes go to
//! the host as `JobOutput`, its file calls under the working directory as `FileRequest`s
//! (`files`), and its end as `JobExited`, after which the kernel frees the job's memory and
//! returns to the loop.
//!
//! **Several jobs at once** (up to `MAX_JOBS`: MPI ranks started by `mpirun -n 4 clowder run`).
//! The first job is entered from the service loop as above; a `LaunchJob` that comes while
//! jobs run is loaded by CPU 0's channel interrupt (where kills and signals for one job of
//! several are acted on too) as a new process, the job's leader, whose first thread goes to
//! the least loaded CPU. Every thread carries its job id (`sched::current_job`), which the
//! output, file and socket messages carry. A job's leader ending beside other jobs kills the
//! job's other processes, and the job's `JobExited` goes once the last of them is gone; the
//! last job to end takes the single-job path (report, park the other CPUs, free everything,
//! back to the loop), so a one-job enclave runs exactly as before. What stays shared between
//! the jobs of an enclave (the daemon lets only one user's jobs share it): the file system of
//! the jobs' files, the host executables read for `execve`, and memory kept for unanswered
//! XEMEM removes, all freed with the last job.
//!
//! **Staying responsive without timer ticks.** The kernel keeps the channel's `waiting` flag
//! set from attach on, so every host message raises the channel interrupt on vCPU 0 (the
//! VMM's MSI route targets APIC ID 0). The job runs in user mode with interrupts enabled, so
//! a job spinning on CPU 0 is interrupted, the handler drains the ring and answers `Ping`
//! (and records file answers, launches and kills), and the job resumes: a few microseconds
//! of kernel work per second. When CPU 0 has nothing to run it halts with interrupts on
//! (the scheduler's idle loop, or the service loop here), and the interrupt wakes it. The
//! kernel never holds the channel lock with interrupts on, so the handler cannot deadlock
//! with the code it interrupts. A dedicated service CPU was the alternative; it would take a
//! core from every multi-vCPU job and still leave one-vCPU enclaves needing the interrupt.

pub mod files;
pub(crate) mod slots;
/// The enclave's pure rules (in `lwk-core`, tested on the host).
pub use lwk_core::enclave as rules;

use crate::arch::channel as machine_channel;
use crate::arch::sync::SpinLock;
use crate::bootinfo::Module;
use crate::cmdline::{self, JobOptions};
use crate::console::log;
use crate::{arch, fs, job, machine, mm};
use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use clowder_channel::{Endpoint, SendError};
use core::sync::atomic::{AtomicBool, Ordering};
use enclave_proto::{EnclaveMessage, FileAttributes, Fragmenter, HostMessage, Reassembler, Stream, MAX_MESSAGE_LEN, PROTOCOL_VERSION};

/// The VMM's defaults (docs/guest-abi.md) when the command line names only the region.
const DEFAULT_VECTOR: u8 = 0x40;
const DEFAULT_DOORBELL_PORT: u16 = 0x520;
/// The service loop's own stack: it outlives every job, whose stacks it abandons.
const SERVICE_STACK_SIZE: u64 = 64 * 1024;
const ENOEXEC: i32 = 8;
const EBUSY: i32 = 16;
const SIGKILL: u32 = 9;
/// The most jobs an enclave runs at once (with those waiting to start): each holds its memory
/// up front, and they share the kernel's threads.
const MAX_JOBS: usize = 8;

/// Where the channel is, from `clowder.channel=<gpa>,<size>` and its companions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    pub physical: u64,
    pub size: u64,
    pub vector: u8,
    pub doorbell_port: u16,
    /// The smallest piece of RAM the host can share (`clowder.ram_page`: 4 KiB, or 2 MiB for
    /// hugetlb-backed RAM); 4 KiB when not said or not a power of two from 4 KiB to 1 GiB.
    pub ram_page: u64,
}

impl ChannelConfig {
    pub fn from_command_line(command_line: &str) -> Option<ChannelConfig> {
        let (physical, size) = rules::parse_channel_region(cmdline::value_of(command_line, "clowder.channel")?)?;
        let hex_value = |key| cmdline::value_of(command_line, key).and_then(rules::parse_hex);
        Some(ChannelConfig {
            physical,
            size,
            vector: hex_value("clowder.channel_vector").map_or(DEFAULT_VECTOR, |vector| vector as u8),
            doorbell_port: hex_value("clowder.channel_port").map_or(DEFAULT_DOORBELL_PORT, |port| port as u16),
            ram_page: hex_value("clowder.ram_page")
                .filter(|page| page.is_power_of_two() && (4096..=1 << 30).contains(page))
                .unwrap_or(4096),
        })
    }
}

/// The answer to one forwarded file call (or to a `ZeroMemory`: a `Result`).
#[derive(Clone, Copy, Debug)]
pub enum FileAnswer {
    Result(i64),
    Attributes(FileAttributes),
}

struct RunningJob {
    /// The job's working directory on the host: paths under it are forwarded.
    cwd: String,
    /// How it ended, once its leader has, beside other jobs (reported when its last process is
    /// gone).
    status: Option<u32>,
}

/// One end of the channel with its sending buffers.
struct Link {
    endpoint: Endpoint,
    doorbell_port: u16,
    frame: Vec<u8>,
    encoded: Vec<u8>,
}

/// The receiving buffers: a frame, and the messages that span frames put back together. They
/// leave the state while the messages are handled (which needs all of it), so a message is
/// handled where it lies, not copied out first (every copy is emulated work here).
struct Inbox {
    frame: Vec<u8>,
    reassembler: Reassembler<'static>,
}

impl Inbox {
    /// What the state holds while its inbox is out.
    fn lent() -> Inbox {
        Inbox { frame: Vec::new(), reassembler: Reassembler::new(&mut []) }
    }
}

impl Link {
    fn send(&mut self, message: &EnclaveMessage<'_>) {
        let length = match message.encode(&mut self.encoded) {
            Ok(length) => length,
            Err(error) => {
                log!("enclave: cannot encode {message:?}: {error:?}");
                return;
            }
        };
        let Ok(mut fragments) = Fragmenter::new(&self.encoded[..length], self.endpoint.max_message_len()) else {
            return;
        };
        while let Some(frame_length) = fragments.next_frame(&mut self.frame) {
            loop {
                match self.endpoint.send(&self.frame[..frame_length]) {
                    Ok(()) => break,
                    // The host drains the ring continuously; wait for room.
                    Err(SendError::Full) => {
                        self.ring_doorbell_if_needed();
                        core::hint::spin_loop();
                    }
                    Err(error) => panic!("enclave channel broken while sending: {error}"),
                }
            }
        }
        self.ring_doorbell_if_needed();
    }

    fn ring_doorbell_if_needed(&self) {
        if self.endpoint.peer_waiting() {
            machine_channel::ring_doorbell(self.doorbell_port);
        }
    }
}

struct State {
    link: Link,
    inbox: Inbox,
    /// The running jobs by id.
    jobs: BTreeMap<u32, RunningJob>,
    /// The jobs' end is under way (the single-job path): no job starts beside them any more.
    ending: bool,
    next_request: u32,
    answers: BTreeMap<u32, FileAnswer>,
    /// `LaunchJob`s that arrived (in the interrupt handler, say), in order: the service loop
    /// starts the first when no job runs, CPU 0's channel interrupt the others beside it.
    pending_launches: VecDeque<Vec<u8>>,
    /// The host asked for the only running job to end, with this status.
    kill_status: Option<u32>,
    /// Jobs the host asked to end while others run, with the signal.
    kills: Vec<(u32, u8)>,
    vcpus: u16,
}

static STATE: SpinLock<Option<State>> = SpinLock::new(None);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static SERVICE_STACK_TOP: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Whether the kernel runs as a persistent enclave (jobs come from the channel).
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut state = STATE.lock();
    f(state.as_mut().expect("enclave channel not attached"))
}

/// What handling the received messages asks of the caller once the channel lock is released.
enum Followup {
    Nothing,
    EndJob(u32),
    Shutdown,
}

impl State {
    /// Takes every message off the ring and handles those that need no more than the lock.
    fn drain(&mut self) -> Followup {
        let mut followup = Followup::Nothing;
        let mut inbox = core::mem::replace(&mut self.inbox, Inbox::lent());
        loop {
            let length = match self.link.endpoint.recv(&mut inbox.frame) {
                Ok(Some(length)) => length,
                Ok(None) => break,
                Err(error) => panic!("enclave channel broken while receiving: {error}"),
            };
            let message = match inbox.reassembler.push(&inbox.frame[..length]) {
                Ok(Some(message)) => message,
                Ok(None) => continue,
                Err(error) => {
                    log!("enclave: bad frame from the host ({error:?}); ignored");
                    continue;
                }
            };
            match self.handle(message) {
                Followup::Nothing => {}
                other => followup = other,
            }
        }
        self.inbox = inbox;
        if let (Some(status), Followup::Nothing) = (self.kill_status, &followup) {
            followup = Followup::EndJob(status);
        }
        followup
    }

    /// The host asks job `job` to end with `signal`: alone, at once (`Followup::EndJob`);
    /// beside other jobs, by CPU 0's channel interrupt (`serve_jobs_beside`).
    fn end_job_for_host(&mut self, job: u32, signal: u32) {
        if !self.jobs.contains_key(&job) {
            return;
        }
        crate::sched::log_job_threads(job);
        if self.jobs.len() == 1 {
            self.kill_status = Some(rules::status_for_signal(signal));
            self.ending = true;
        } else {
            self.kills.push((job, (signal & 0x7f) as u8));
        }
    }

    fn send_queued_xemem(&mut self) {
        crate::xpmem::host_link::send_queued(|message| self.link.send(&EnclaveMessage::Xemem { message }));
    }

    fn handle(&mut self, bytes: &[u8]) -> Followup {
        let message = match HostMessage::decode(bytes) {
            Ok(message) => message,
            Err(error) => {
                log!("enclave: malformed message from the host ({error:?}); ignored");
                return Followup::Nothing;
            }
        };
        match message {
            HostMessage::Ping { nonce } => {
                self.link.send(&EnclaveMessage::Pong { nonce });
                // The host's pings are the XEMEM node's clock (retries).
                crate::xpmem::host_link::tick();
                self.send_queued_xemem();
            }
            HostMessage::LaunchJob(launch) => {
                if self.jobs.len() + self.pending_launches.len() >= MAX_JOBS {
                    let reason = alloc::format!("the enclave runs {MAX_JOBS} jobs, its most at once; try again when one has ended");
                    self.link.send(&EnclaveMessage::LaunchFailed { job: launch.job, errno: EBUSY, reason: reason.as_bytes() });
                } else {
                    self.pending_launches.push_back(bytes.to_vec());
                }
            }
            HostMessage::KillJob { job } => self.end_job_for_host(job, SIGKILL),
            // No signal handlers run in this kernel: a signal the host sends ends the job, as
            // its default action would for the terminating signals clowder sends.
            HostMessage::SignalJob { job, signal } => self.end_job_for_host(job, signal),
            HostMessage::Shutdown => return Followup::Shutdown,
            HostMessage::FileResult { request, result, .. } => {
                self.answers.insert(request, FileAnswer::Result(result));
                files::answer_arrived();
            }
            HostMessage::FileAttributes { request, attributes, .. } => {
                self.answers.insert(request, FileAnswer::Attributes(attributes));
                files::answer_arrived();
            }
            HostMessage::MemoryZeroed { request, result } => {
                self.answers.insert(request, FileAnswer::Result(result as i64));
            }
            HostMessage::SocketResult { job, request, result, events, data } => crate::net::answer(job, request, result, events, data),
            HostMessage::SocketReady { job, handle, events } => crate::net::ready(job, handle, events),
            HostMessage::SharedFileTruncated { gpa, len } => {
                if crate::job::host_file_truncated(gpa, len) {
                    log!(
                        "mmap: a host file was truncated under the job's shared mapping: its pages at {gpa:#x}+{len:#x} unmapped (SIGBUS)"
                    );
                }
            }
            HostMessage::Xemem { message } => {
                crate::xpmem::host_link::from_host(message);
                self.send_queued_xemem();
            }
        }
        Followup::Nothing
    }
}

/// Acts on what `drain` asked for; ending the job or the machine does not return.
fn follow_up(followup: Followup) {
    match followup {
        Followup::Nothing => {}
        Followup::EndJob(status) => end_job(status),
        Followup::Shutdown => {
            log!("enclave: shutting down at the host's request");
            machine::exit(0)
        }
    }
}

/// Sends the XEMEM messages `crate::xpmem::host_link` queued to the host.
pub fn send_xemem() {
    if is_active() {
        with_state(State::send_queued_xemem);
    }
}

/// Serves the host until `done()` (a job thread waiting for an XEMEM answer), as a forwarded
/// file call waits: CPU 0 sleeps until the channel interrupt, other CPUs poll the ring.
#[inline(always)] // into each waiting request: a call is emulated work on PVM
pub fn serve_host_until(done: impl Fn() -> bool) {
    // On CPU 0 every host message raises the channel interrupt, whose handler drains the ring
    // while this CPU sleeps in `wait_for_host_message`: a drain here would find it empty
    // (~150 emulated instructions on PVM, per request).
    let polls = crate::arch::tables::current_cpu() != 0;
    loop {
        if polls {
            follow_up(with_state(State::drain));
        }
        // A thread whose process is being killed stops waiting (its caller sees no answer):
        // beside other jobs, its job ends only once it has left, and the host may never
        // answer a killed job.
        if done() || crate::sched::current_thread_doomed() {
            return;
        }
        wait_for_host_message();
    }
}

/// One round of a wait for the host: CPU 0 sleeps until the channel interrupt (or another
/// CPU's tick asking it to end the job); other CPUs poll the ring (they get no channel
/// interrupt) and park if the job ended elsewhere.
pub fn wait_for_host_message() {
    let cpu = crate::arch::tables::current_cpu();
    if cpu == 0 {
        crate::arch::apic::sleep_until_interrupt();
        crate::sched::end_job_if_requested(cpu);
    } else {
        crate::sched::park_if_requested(cpu);
        // Interrupts are off here: answer a TLB shootdown without waiting for the IPI.
        crate::sched::flush_tlb_if_stale();
        core::hint::spin_loop();
    }
}

/// One round of a busy wait for the host (a file slot's answer while the host polls): as
/// `wait_for_host_message`, but CPU 0 drains the channel instead of sleeping.
pub fn poll_host_once() {
    let cpu = crate::arch::tables::current_cpu();
    if cpu == 0 {
        on_channel_interrupt();
        crate::sched::end_job_if_requested(cpu);
    } else {
        crate::sched::park_if_requested(cpu);
        crate::sched::flush_tlb_if_stale();
    }
    core::hint::spin_loop();
}

/// Sends a socket call for job `job` (`crate::net`); `numbered` hears its request number
/// first, so an answer that comes at once finds its caller waiting.
pub fn send_socket_request(job: u32, op: enclave_proto::SocketOp<'_>, numbered: impl FnOnce(u32)) {
    with_state(|state| {
        let request = state.next_request;
        state.next_request = state.next_request.wrapping_add(1);
        numbered(request);
        state.link.send(&EnclaveMessage::SocketRequest { job, request, op });
    })
}

/// Ranges below this are cleared here: a host round trip costs about what clearing 64 KiB
/// does in emulated kernel code.
const HOST_ZERO_MIN: u64 = 64 * 1024;

/// Clears guest-physical `[physical, physical + len)` of a finished job. Large ranges go to
/// the host (`ZeroMemory`), which clears them at native speed: in this kernel clearing is
/// emulated work on PVM (about 40 ms per MiB), and a job's gigabyte would take the better part
/// of a minute, past the host's ping timeout. What the host refuses is cleared here.
pub fn zero_memory(physical: u64, len: u64) {
    if len >= HOST_ZERO_MIN && is_active() && (physical | len).is_multiple_of(4096) {
        let request = with_state(|state| {
            let request = state.next_request;
            state.next_request = state.next_request.wrapping_add(1);
            state.link.send(&EnclaveMessage::ZeroMemory { request, gpa: physical, len });
            request
        });
        loop {
            let (followup, answer) = with_state(|state| (state.drain(), state.answers.remove(&request)));
            match answer {
                Some(FileAnswer::Result(0)) => return,
                Some(answer) => {
                    log!("enclave: the host did not clear {len:#x} bytes at {physical:#x} ({answer:?}); clearing them here");
                    break;
                }
                None => {}
            }
            follow_up(followup);
            wait_for_host_message();
        }
    }
    crate::arch::phys::zero(physical, len as usize);
}

/// The channel interrupt: the host wrote while the kernel was not looking.
pub fn on_channel_interrupt() {
    if !is_active() {
        return;
    }
    let followup = with_state(State::drain);
    follow_up(followup);
    if crate::arch::tables::current_cpu() == 0 {
        serve_jobs_beside();
    }
}

/// On CPU 0 while jobs run (not ending): starts the jobs waiting to start beside them and
/// ends those the host asked to end. Where no lock is held (the channel interrupt, or a
/// poll from a loop holding none); a kill may end the last job, which does not return.
fn serve_jobs_beside() {
    loop {
        let (launch, kills) = with_state(|state| {
            if state.jobs.is_empty() || state.ending {
                return (None, Vec::new());
            }
            (state.pending_launches.pop_front(), core::mem::take(&mut state.kills))
        });
        for (job, signal) in kills {
            crate::process::kill_job_by_signal(job, signal);
        }
        match launch {
            Some(bytes) => launch_beside(&bytes),
            None => return,
        }
    }
}

/// Whether jobs other than `job` run. If not, `job`'s end is the enclave's single-job end
/// (`end_job`), which starts now: no job starts beside it any more.
pub fn other_jobs_run(job: u32) -> bool {
    if !is_active() {
        return false;
    }
    with_state(|state| {
        let others = state.jobs.keys().any(|&other| other != job);
        state.ending |= !others;
        others
    })
}

/// Job `job`'s leader ended beside other jobs, with `status` (the first one counts).
pub fn job_ending(job: u32, status: u32) {
    with_state(|state| {
        if let Some(running) = state.jobs.get_mut(&job) {
            running.status.get_or_insert(status);
        }
    });
}

/// The last process of job `job`, whose leader ended beside other jobs, is gone: its end is
/// reported; if no job is left, the enclave ends them as one job's end (never returns).
pub fn job_finished(job: u32) {
    let (status, none_left) = with_state(|state| {
        let Some(finished) = state.jobs.remove(&job) else { return (0, false) };
        let status = finished.status.unwrap_or(0);
        state.link.send(&EnclaveMessage::JobExited { job, status });
        state.ending |= state.jobs.is_empty();
        (status, state.jobs.is_empty())
    });
    if none_left {
        end_job(status)
    }
}

/// For kernel loops on CPU 0 that poll with interrupts off (the idle loop watching a timed
/// wait): the channel interrupt cannot arrive there, so they drain the ring themselves now and
/// then. Cheap when nothing came: one look at the ring's counter.
pub fn serve_host_while_polling(cpu: usize) {
    if cpu == 0 {
        on_channel_interrupt();
    }
}

/// Attaches the channel, says `Hello` and serves the host for ever.
pub fn run(config: ChannelConfig, vcpus: u16) -> ! {
    // The channel is reserved memory at the top of RAM: the physical window covers it only
    // when RAM ends within the first GiB, which the boot tables map whole.
    map_host_region(config.physical, config.size);
    let channel = machine_channel::attach(config.physical, config.size as usize)
        .unwrap_or_else(|error| panic!("cannot attach the enclave channel at {:#x}: {error}", config.physical));
    let endpoint = channel.guest_end().unwrap_or_else(|error| panic!("enclave channel corrupt: {error}"));
    let frame_len = endpoint.max_message_len();
    let reassembly: &'static mut [u8] = Box::leak(vec![0u8; MAX_MESSAGE_LEN].into_boxed_slice());
    let inbox = Inbox { frame: vec![0u8; frame_len], reassembler: Reassembler::new(reassembly) };
    let link = Link { endpoint, doorbell_port: config.doorbell_port, frame: vec![0u8; frame_len], encoded: vec![0u8; MAX_MESSAGE_LEN] };
    // Interrupts from here on: every host message raises the channel vector.
    link.endpoint.set_waiting(true);
    machine_channel::install_interrupt_handler(config.vector);
    *STATE.lock() = Some(State {
        link,
        inbox,
        jobs: BTreeMap::new(),
        ending: false,
        next_request: 1,
        answers: BTreeMap::new(),
        pending_launches: VecDeque::new(),
        kill_status: None,
        kills: Vec::new(),
        vcpus,
    });
    let stack = mm::pmem::allocate(SERVICE_STACK_SIZE, 4096).expect("no memory for the service stack");
    SERVICE_STACK_TOP.store(arch::phys::to_virtual(stack) + SERVICE_STACK_SIZE, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    let memory = mm::pmem::total_managed();
    with_state(|state| state.link.send(&EnclaveMessage::Hello { version: PROTOCOL_VERSION, vcpus, memory }));
    // Without it the host asks this kernel for every attach of its memory, and never parks one.
    match mm::aspace::publish_mapping_changes(config.ram_page) {
        Some(counter) => with_state(|state| state.link.send(&EnclaveMessage::MappingCounter { gpa: counter })),
        None => log!("no {:#x} bytes of RAM for the count of page-table changes: not published", config.ram_page),
    }
    match slots::publish(vcpus, config.doorbell_port) {
        Some(message) => with_state(|state| state.link.send(&message)),
        None => log!("no memory for the file-call slots: file calls go on the channel"),
    }
    // XEMEM: look for the name server (clowderd) on the channel.
    crate::xpmem::host_link::link_up();
    with_state(State::send_queued_xemem);
    machine_channel::run_on_stack(SERVICE_STACK_TOP.load(Ordering::Relaxed), service_loop)
}

/// Waits for messages with the CPU halted, and starts the jobs the host sends.
extern "C" fn service_loop() -> ! {
    loop {
        let (followup, launch) = with_state(|state| (state.drain(), state.pending_launches.pop_front()));
        follow_up(followup);
        match launch {
            Some(bytes) => launch_job(&bytes),
            // The flag is set, so a message that arrived since `drain` has raised the
            // interrupt, which is pending and ends the HLT at once.
            None => arch::apic::sleep_until_interrupt(),
        }
    }
}

/// Makes guest-physical `[start, start + len)` (a region the host added above RAM, or the
/// reserved channel) readable through the kernel's physical-memory window.
fn map_host_region(start: u64, len: u64) {
    let first = start / 4096 * 4096;
    let mut page = first;
    while page < start + len {
        mm::map_device_page(page);
        page += 4096;
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A job to start, from a `LaunchJob`.
struct Launch {
    job: u32,
    /// The launching client's host pid (0: none): the job's first process's, if free.
    launcher: u64,
    cwd: String,
    module: Module,
    options: JobOptions,
}

/// Reads a `LaunchJob` and adds its files to the file system (emptied first when `alone`);
/// `None` (the host told why) if it cannot start.
fn read_launch(bytes: &[u8], alone: bool) -> Option<Launch> {
    let Ok(HostMessage::LaunchJob(launch)) = HostMessage::decode(bytes) else { return None };
    map_host_region(launch.binary.gpa, launch.binary.len);
    if alone {
        fs::clear();
    }
    for file in launch.files.iter() {
        map_host_region(file.gpa, file.len);
        fs::add_file(&text(file.name), file.gpa, file.len);
    }
    let options = JobOptions {
        verbose: false,
        heap_size: (launch.heap_size != 0).then_some(launch.heap_size),
        stack_size: if launch.stack_size != 0 { launch.stack_size } else { cmdline::DEFAULT_STACK_SIZE },
        argv: launch.argv.iter().map(text).collect(),
        env: launch.env.iter().map(text).collect(),
    };
    if options.argv.is_empty() {
        with_state(|state| state.link.send(&EnclaveMessage::LaunchFailed { job: launch.job, errno: 22, reason: b"empty argv" }));
        return None;
    }
    let module = Module { start: launch.binary.gpa, size: launch.binary.len };
    Some(Launch { job: launch.job, launcher: launch.pid, cwd: text(launch.cwd), module, options })
}

fn report_load_failure(job: u32, error: job::LoadError) {
    let reason = alloc::format!("{error}");
    log!("enclave: job {job} failed to load: {reason}");
    with_state(|state| state.link.send(&EnclaveMessage::LaunchFailed { job, errno: ENOEXEC, reason: reason.as_bytes() }));
}

/// Loads the job `bytes` (a `LaunchJob`) describes, alone in the enclave, starts those
/// waiting beside it and enters it; returns only if it failed.
fn launch_job(bytes: &[u8]) {
    let Some(launch) = read_launch(bytes, true) else { return };
    match job::load(Some(&launch.module), &launch.options, launch.job, launch.launcher) {
        Ok(frame) => {
            // On PVM the first job's first system call moved LSTAR to the ring-3 SYSCALL page
            // for good; later jobs need that page in their address spaces from the start.
            job::map_ring3_syscall_page();
            let vcpus = with_state(|state| state.vcpus);
            crate::sched::wait_for_cpus(vcpus as u32);
            with_state(|state| {
                state.jobs.insert(launch.job, RunningJob { cwd: launch.cwd, status: None });
                state.ending = false;
                state.kill_status = None;
                state.answers.clear();
                state.link.send(&EnclaveMessage::JobStarted { job: launch.job });
            });
            // `mpirun -n 4`'s launches come together: the others start now, not at the next
            // message from the host.
            serve_jobs_beside();
            arch::trap::enter_user(&frame)
        }
        Err(error) => report_load_failure(launch.job, error),
    }
}

/// Loads the job `bytes` describes as a new process beside the running jobs (on CPU 0, no
/// lock held); it runs once a CPU takes its first thread.
fn launch_beside(bytes: &[u8]) {
    let Some(launch) = read_launch(bytes, false) else { return };
    // In the table first: its first thread may run (and ask for files) at once elsewhere.
    with_state(|state| state.jobs.insert(launch.job, RunningJob { cwd: launch.cwd, status: None }));
    match job::load_beside(&launch.module, &launch.options, launch.job, launch.launcher) {
        Ok(_) => with_state(|state| state.link.send(&EnclaveMessage::JobStarted { job: launch.job })),
        Err(error) => {
            with_state(|state| state.jobs.remove(&launch.job));
            report_load_failure(launch.job, error)
        }
    }
}

/// The jobs are over (the last one exited, faulted or was killed): report those not yet
/// reported (with `status` unless they have their own), then, on the service stack, free
/// their memory and go back to the service loop. On a CPU other than 0 the end is handed to
/// CPU 0, where the service loop runs.
pub fn end_job(status: u32) -> ! {
    let cpu = arch::tables::current_cpu();
    if cpu != 0 {
        crate::sched::hand_job_end_to_cpu0(status)
    }
    let (ended, vcpus) = with_state(|state| {
        let ended: Vec<(u32, u32)> =
            core::mem::take(&mut state.jobs).into_iter().map(|(id, job)| (id, job.status.unwrap_or(status))).collect();
        state.kill_status = None;
        state.kills.clear();
        state.answers.clear();
        (ended, state.vcpus)
    });
    // Reusing the machine is safe only if no thread of this job can run again: with one vCPU
    // the others sit in CPU 0's queue, which the next job replaces; with more, the other CPUs
    // drop the job's threads and park until the next job. A CPU that does not park (no
    // x2APIC id to send it the IPI, or stuck in the kernel) may still run the job's code:
    // then the enclave ends after reporting the job.
    let reusable = vcpus <= 1 || crate::sched::park_other_cpus();
    // Report first: the user need not wait while the memory is cleared (a `LaunchJob` that
    // comes meanwhile waits in the ring until the service loop runs).
    with_state(|state| {
        for &(job, status) in &ended {
            state.link.send(&EnclaveMessage::JobExited { job, status });
        }
        state.ending = false;
    });
    if !reusable {
        log!("enclave: job threads may still be live on other CPUs; stopping rather than reusing their memory");
        machine::exit(crate::job::shell_status(status))
    }
    crate::sched::clear_job_end_request();
    machine_channel::run_on_stack(SERVICE_STACK_TOP.load(Ordering::Relaxed), reclaim_job_then_serve)
}

/// On the service stack, with every other CPU parked: gives back everything the job held
/// (its memory and page tables, its threads' kernel stacks) and serves the host again.
extern "C" fn reclaim_job_then_serve() -> ! {
    // The job's page tables are about to be freed: stop using them first.
    crate::sched::use_kernel_tables(0);
    job::release(zero_memory);
    crate::sched::release_job_threads();
    crate::net::forget_job();
    mm::free_retired_tables();
    fs::clear();
    service_loop()
}

/// Streams a write to the console descriptors to the host (descriptor 2 is stderr).
pub fn job_output(descriptor: crate::job::descriptors::Fd, bytes: &[u8]) {
    let stream = if rules::is_stderr(descriptor.into()) { Stream::Stderr } else { Stream::Stdout };
    let job = crate::sched::current_job();
    with_state(|state| {
        if !state.jobs.contains_key(&job) {
            return;
        }
        let chunk = enclave_proto::max_output_chunk(state.link.endpoint.max_message_len()).max(1);
        for data in bytes.chunks(chunk) {
            state.link.send(&EnclaveMessage::JobOutput { job, stream, data });
        }
    });
}
