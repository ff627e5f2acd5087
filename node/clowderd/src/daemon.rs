//! The daemon's state (enclaves, their cores, recently removed ones) and the handling of each
//! API request. Socket plumbing is in `server`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clowder_api::daemon::{
    ChannelInfo, CreateReply, EnclaveInfo, EnclaveKind, JobEvent as ApiJobEvent, LogsReply, LsReply, Mode, RemovedInfo, Request, RmReply,
    RunReply, Stream, VersionReply,
};
use clowder_api::{ok_reply, ApiError, ErrorKind, API_VERSION};
use serde_json::Value;

use crate::api::{check_create, check_run, error_reply, one_shot_name, CreateRequest, RunRequest, RUN_FIXED_FDS};
use crate::console::LogBook;
use crate::cores::{choose_cores, format_cpu_list, usable_cores, CoreRequest};
use crate::cpuset::Cpusets;
use crate::enclave::{Enclave, JobEvent, JobFile, JobSpec, Liveness};
use crate::hio::{Identity, Scope};
use crate::linux_enclave::{self, LinuxGuest, LinuxLauncher};
use crate::machine::{Launcher, MachineSpec, Populated};
use crate::memory::{check_request, format_size, HostMemory};
use crate::oneshot::{kernel_command_line, OneShot, RunEvent};
use crate::owner::{self, Owner};
use crate::peer::{may_create_enclaves, Peer};
use crate::sys;
use crate::xemem::service::XememService;
use crate::xemem::{EnclaveUser, XememLinks};

/// How many removed enclaves `ls` and `logs` remember.
const REMEMBERED_REMOVALS: usize = 16;

pub struct DaemonConfig {
    /// `clowder-vmm` and the LWK image for one-shot enclaves.
    pub vmm: PathBuf,
    pub kernel: PathBuf,
    /// Memory of a one-shot enclave when the request names none.
    pub oneshot_memory: u64,
    /// Move host tasks off enclave cores with cpusets.
    pub isolate_cores: bool,
    pub liveness: Liveness,
    /// The `clowder` group's id, if the group exists.
    pub admin_group: Option<u32>,
}

enum Occupant {
    /// Cores and memory are reserved; the machine is booting.
    Starting,
    Persistent(Arc<Enclave>),
    OneShot {
        pid: u32,
        log: Arc<LogBook>,
        job: String,
    },
}

struct Entry {
    owner: Owner,
    /// The directory its jobs are confined to (`create`'s `confine`), if any.
    confine: Option<String>,
    cores: Vec<usize>,
    memory: u64,
    hugepages: bool,
    created: SystemTime,
    occupant: Occupant,
    kind: EnclaveKind,
    /// The block of ids its kernel numbers threads and forked processes from
    /// (`lwk_core::ids`), none other enclave's: no two enclaves' processes share a pid.
    id_block: u64,
}

struct Removed {
    name: String,
    owner: Owner,
    reason: String,
    at: SystemTime,
    log: Arc<LogBook>,
}

#[derive(Default)]
struct State {
    enclaves: BTreeMap<String, Entry>,
    removed: VecDeque<Removed>,
    next_job: u32,
    next_oneshot: u64,
}

pub struct Daemon {
    config: DaemonConfig,
    launcher: Box<dyn Launcher>,
    cpusets: Result<Cpusets, String>,
    state: Mutex<State>,
    /// The host's XEMEM broker, once `host_xemem` gave it one (tests may run without).
    xemem: OnceLock<XememService>,
    /// XEMEM's name-server node, with a link to each persistent enclave.
    xemem_links: Arc<XememLinks>,
}

fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl State {
    fn taken_cores(&self) -> BTreeMap<usize, String> {
        self.enclaves.iter().flat_map(|(name, entry)| entry.cores.iter().map(move |core| (*core, name.clone()))).collect()
    }

    fn known_names(&self) -> String {
        if self.enclaves.is_empty() {
            "there are no enclaves; create one with: clowder enclave create --name NAME --cores 1 --mem 1G".into()
        } else {
            format!("known enclaves: {}", self.enclaves.keys().cloned().collect::<Vec<_>>().join(", "))
        }
    }

    fn remember_removal(&mut self, name: &str, owner: Owner, reason: String, log: Arc<LogBook>) {
        if self.removed.len() == REMEMBERED_REMOVALS {
            self.removed.pop_front();
        }
        self.removed.push_back(Removed { name: name.to_string(), owner, reason, at: SystemTime::now(), log });
    }
}

/// What a `run` request carried: the binary, the working directory, the input files.
struct RunFiles {
    binary: File,
    cwd_dir: File,
    inputs: Vec<JobFile>,
}

/// Where a request handler sends the job events that come before its final reply, and how it
/// learns, while a job is quiet, that nobody is listening any more.
pub trait EventSink {
    fn send(&mut self, event: &ApiJobEvent) -> std::io::Result<()>;
    fn client_gone(&self) -> bool;
}

/// How often a job that prints nothing is checked for a client that went away.
const CLIENT_CHECK_INTERVAL: Duration = Duration::from_millis(250);

impl Daemon {
    pub fn new(config: DaemonConfig, launcher: Box<dyn Launcher>) -> Arc<Daemon> {
        Daemon::with_xemem_links(config, launcher, XememLinks::new())
    }

    /// A daemon whose XEMEM node is `xemem_links` (a sub-manager's: `XememLinks::sub_manager`).
    pub fn with_xemem_links(config: DaemonConfig, launcher: Box<dyn Launcher>, xemem_links: Arc<XememLinks>) -> Arc<Daemon> {
        let cpusets = if config.isolate_cores {
            Cpusets::detect()
        } else {
            // Even so, a host left confined by a killed isolating daemon gets its cores back.
            Cpusets::repair_left_over().iter().for_each(|repair| log::info!("{repair}"));
            Err("clowderd runs without --isolate-cores".into())
        };
        match &cpusets {
            Ok(cpusets) => cpusets.repairs().iter().for_each(|repair| log::info!("{repair}")),
            Err(why) if config.isolate_cores => log::warn!("cannot isolate cores: {why}"),
            Err(_) => {}
        }
        Arc::new(Daemon { config, launcher, cpusets, state: Mutex::new(State::default()), xemem: OnceLock::new(), xemem_links })
    }

    /// Answers one request; `events` receives the lines that come before the final reply.
    pub fn handle(self: &Arc<Self>, request: Request, files: Vec<File>, peer: &Peer, events: &mut dyn EventSink) -> Value {
        if request.is_privileged() && !may_create_enclaves(peer, self.config.admin_group) {
            return error_reply(
                ErrorKind::PermissionDenied,
                format!(
                    "permission denied: creating enclaves and running jobs needs root or membership in the `{}` group \
                     (you are uid {}); ask an administrator to run: usermod -aG {} $USER",
                    crate::peer::ADMIN_GROUP,
                    peer.uid,
                    crate::peer::ADMIN_GROUP
                ),
            );
        }
        if !matches!(request, Request::Run(_)) && !files.is_empty() {
            return error_reply(ErrorKind::InvalidArgument, "only `run` takes file descriptors");
        }
        let checked = match request {
            Request::Version => {
                return ok_reply(&VersionReply { daemon_version: env!("CARGO_PKG_VERSION").into(), api_version: API_VERSION })
            }
            Request::Create(create) => check_create(create).map(|create| self.create(create, peer, events)),
            Request::Ls => Ok(self.list(peer)),
            Request::Rm(named) => Ok(self.remove(&named.name, peer)),
            Request::Logs(named) => Ok(self.logs(&named.name, peer)),
            Request::Run(run) => check_run(run).map(|run| self.run(run, files, peer, events)),
            Request::XememLs => Ok(match self.xemem.get() {
                Some(xemem) => xemem.list_reply(&self.xemem_links.list()),
                None => error_reply(ErrorKind::Unavailable, "this clowderd runs without an XEMEM broker, so there are no segments to list"),
            }),
        };
        checked.unwrap_or_else(|error| error.reply())
    }

    /// XEMEM's name-server node and its links to the enclaves.
    pub fn xemem_links(&self) -> &Arc<XememLinks> {
        &self.xemem_links
    }

    /// Makes `xemem` the daemon's XEMEM broker (once; a second one is handed back).
    pub fn host_xemem(&self, xemem: XememService) -> Result<(), XememService> {
        // Host processes reach the enclaves' segments through the daemon's name-server node.
        xemem.broker.set_enclaves(self.xemem_links.clone());
        self.xemem_links.set_attachers(xemem.broker.clone());
        if self.xemem_links.is_name_server() {
            self.xemem_links.set_broker(xemem.broker.clone());
        } else {
            // A sub-manager's host segments live at the upstream name server; its enclaves
            // reach every segment through it.
            xemem.broker.set_sub_manager();
        }
        self.xemem.set(xemem)
    }

    /// Reserves cores and memory under a new name, or says why not.
    fn reserve(
        &self,
        name: &str,
        owner: Owner,
        cores: &CoreRequest,
        memory: u64,
        hugepages: bool,
        confine: Option<String>,
    ) -> Result<(Vec<usize>, u64), ApiError> {
        let usable = usable_cores().map_err(|e| ApiError::new(ErrorKind::Internal, e))?;
        check_request(memory, hugepages, HostMemory::read()).map_err(|e| ApiError::new(ErrorKind::ResourceExhausted, e))?;
        let mut state = self.state.lock().unwrap();
        if state.enclaves.contains_key(name) {
            return Err(ApiError::new(
                ErrorKind::AlreadyExists,
                format!("an enclave named {name} already exists (remove it with: clowder enclave rm {name})"),
            ));
        }
        let cores = choose_cores(cores, &usable, &state.taken_cores()).map_err(|e| ApiError::new(ErrorKind::ResourceExhausted, e))?;
        let id_block =
            (0..lwk_core::ids::BLOCKS).find(|block| state.enclaves.values().all(|entry| entry.id_block != *block)).ok_or_else(|| {
                ApiError::new(ErrorKind::ResourceExhausted, format!("the node has {} enclaves, its most", lwk_core::ids::BLOCKS))
            })?;
        let entry = Entry {
            owner,
            confine,
            cores: cores.clone(),
            memory,
            hugepages,
            created: SystemTime::now(),
            occupant: Occupant::Starting,
            kind: EnclaveKind::Lwk,
            id_block,
        };
        state.enclaves.insert(name.to_string(), entry);
        Ok((cores, id_block))
    }

    /// The cores enclaves hold (the host has the rest).
    fn enclave_cores(&self) -> BTreeSet<usize> {
        self.state.lock().unwrap().taken_cores().into_keys().collect()
    }

    fn create(self: &Arc<Self>, request: CreateRequest, peer: &Peer, events: &mut dyn EventSink) -> Value {
        let name = request.name.clone();
        let share_gid = match request.share_group.as_deref().map(|group| owner::share_group(group, peer)).transpose() {
            Ok(gid) => gid,
            Err(e) => return e.reply(),
        };
        let owner = Owner { uid: peer.uid, share_gid };
        let guest = match request.linux.as_ref().map(|linux| LinuxGuest::open(linux, peer.uid)).transpose() {
            Ok(guest) => guest,
            Err(e) => return error_reply(ErrorKind::InvalidArgument, format!("enclave {name}: {e}")),
        };
        let (cores, id_block) = match self.reserve(&name, owner, &request.cores, request.memory, request.hugepages, request.confine.clone())
        {
            Ok(reserved) => reserved,
            Err(e) => return e.reply(),
        };
        let linux = guest.map(|guest| LinuxLauncher { inner: self.launcher.as_ref(), guest });
        let (launcher, liveness) = match &linux {
            Some(linux) => {
                if let Some(entry) = self.state.lock().unwrap().enclaves.get_mut(&name) {
                    entry.kind = EnclaveKind::Linux;
                }
                (linux as &dyn Launcher, Liveness { hello_timeout: linux_enclave::HELLO_TIMEOUT, ..self.config.liveness })
            }
            None => (self.launcher.as_ref(), self.config.liveness),
        };
        let spec = MachineSpec { name: name.clone(), cores: cores.clone(), memory: request.memory, hugepages: request.hugepages, id_block };
        let log = Arc::new(LogBook::new(2000));
        // Progress goes to a client that asked for it, until a send fails: the enclave starts
        // all the same, and the reply finds out whether the client is still there.
        let mut relay = request.progress;
        let mut progress = |populated: Populated| {
            if relay {
                let event = ApiJobEvent::Progress {
                    done_mib: populated.done_mib,
                    total_mib: populated.total_mib,
                    elapsed_ms: populated.elapsed_ms,
                };
                relay = events.send(&event).is_ok();
            }
        };
        let (enclave, receiver) = match Enclave::start(spec, launcher, liveness, log.clone(), &mut progress) {
            Ok(started) => started,
            Err(e) => {
                let mut state = self.state.lock().unwrap();
                state.enclaves.remove(&name);
                // Keep its log: `clowder logs NAME` shows what went wrong.
                state.remember_removal(&name, owner, format!("did not start: {}", e.lines().next().unwrap_or("")), log);
                return error_reply(ErrorKind::Failed, format!("enclave {name} did not start: {e}"));
            }
        };
        let mut notes = Vec::new();
        match (&self.cpusets, enclave.pid) {
            (Ok(cpusets), Some(pid)) => match cpusets.isolate(&name, &cores, &self.enclave_cores(), pid) {
                Ok(done) => notes.push(done),
                Err(e) => notes.push(format!("host tasks were not moved off cores {}: {e}", format_cpu_list(cores.iter().copied()))),
            },
            (Err(why), _) => notes.push(format!(
                "host tasks were not moved off cores {} ({why}); the enclave's vCPUs are pinned to them",
                format_cpu_list(cores.iter().copied())
            )),
            (Ok(_), None) => {}
        }
        for note in &notes {
            enclave.log.push(format!("clowderd: {note}"));
        }
        let registered = match self.state.lock().unwrap().enclaves.get_mut(&name) {
            Some(entry) => {
                entry.occupant = Occupant::Persistent(enclave.clone());
                true
            }
            None => false,
        };
        if !registered {
            // The daemon tore everything down while this enclave was booting.
            enclave.stop();
            return error_reply(ErrorKind::Failed, format!("enclave {name} was removed while it started (clowderd is shutting down)"));
        }
        let daemon = self.clone();
        let pumped = enclave.clone();
        let liveness = self.config.liveness;
        let xemem_links = self.xemem_links.clone();
        let user = EnclaveUser { uid: peer.uid, gid: peer.gid };
        std::thread::Builder::new()
            .name(format!("enclave-{name}"))
            .spawn(move || {
                if let Some(reason) = pumped.pump(receiver, liveness, &xemem_links, user) {
                    daemon.enclave_failed(&pumped, reason);
                }
            })
            .expect("spawning an enclave thread");
        if let Some(sockets) = linux.as_ref().and_then(|_| self.launcher.linux_xemem(&name)) {
            // The guest acts as the enclave's owner in XEMEM; it keeps its jobs if this fails.
            let owner = crate::xemem::vm::VmOwner { uid: peer.uid, gid: peer.gid, groups: peer.groups.clone() };
            let agent = enclave.clone();
            let agent = Box::new(move |event: xemem::pci::GuestEvent| agent.send_xemem(&event.to_bytes()));
            if let Err(e) = crate::xemem::vm::start(self.xemem_links.clone(), enclave.ram(), sockets, owner, agent, enclave.log.clone()) {
                enclave.log.push(format!("clowderd: xemem: the VM has no XEMEM device: {e}"));
            }
        }
        log::info!("created enclave {name} on cores {}", format_cpu_list(cores.iter().copied()));
        match self.describe(&name, peer) {
            Some(enclave) => ok_reply(&CreateReply { enclave, notes }),
            None => error_reply(ErrorKind::Failed, format!("enclave {name} failed as soon as it started; see: clowder logs {name}")),
        }
    }

    /// Removes a failed enclave, if it is still the one registered under its name.
    fn enclave_failed(&self, enclave: &Arc<Enclave>, reason: String) {
        let mut state = self.state.lock().unwrap();
        let owner = match state.enclaves.get(&enclave.name) {
            Some(Entry { occupant: Occupant::Persistent(e), owner, .. }) if Arc::ptr_eq(e, enclave) => *owner,
            _ => return,
        };
        state.enclaves.remove(&enclave.name);
        state.remember_removal(&enclave.name, owner, reason.clone(), enclave.log.clone());
        drop(state);
        self.release_cpuset(&enclave.name);
        log::warn!("enclave {} failed and was removed: {reason}", enclave.name);
    }

    fn release_cpuset(&self, name: &str) {
        if let Ok(cpusets) = &self.cpusets {
            match cpusets.release(name, &self.enclave_cores()) {
                Ok(done) => log::info!("{done}"),
                Err(e) => log::error!("giving enclave {name}'s cores back to the host: {e}"),
            }
        }
    }

    /// An enclave as `ls` shows it to `viewer`: what its one-shot job runs only to those who
    /// may read the job's arguments.
    fn describe_entry(name: &str, entry: &Entry, viewer: &Peer) -> EnclaveInfo {
        let (mode, state, pid, jobs, channel) = match &entry.occupant {
            Occupant::Starting => (Mode::Persistent, "starting".to_string(), None, 0, None),
            Occupant::Persistent(enclave) => (
                Mode::Persistent,
                "ready".to_string(),
                enclave.pid,
                enclave.running_jobs(),
                Some(ChannelInfo { version: enclave_proto::PROTOCOL_VERSION, vcpus: enclave.kernel_vcpus }),
            ),
            // A one-shot enclave's kernel takes its job from the command line, not the channel.
            Occupant::OneShot { pid, job, .. } => {
                let state = if entry.owner.may_read(viewer) { format!("running {job}") } else { "running".to_string() };
                (Mode::OneShot, state, Some(*pid), 1, None)
            }
        };
        EnclaveInfo {
            name: name.to_string(),
            kind: entry.kind.clone(),
            mode,
            state,
            cores: format_cpu_list(entry.cores.iter().copied()),
            mem: format_size(entry.memory),
            hugepages: entry.hugepages,
            pid,
            jobs,
            created: unix_seconds(entry.created),
            channel,
            owner: owner::user_name(entry.owner.uid),
            owner_uid: entry.owner.uid,
            share_group: entry.owner.share_gid.map(owner::group_name),
        }
    }

    fn describe(&self, name: &str, viewer: &Peer) -> Option<EnclaveInfo> {
        let state = self.state.lock().unwrap();
        state.enclaves.get(name).map(|entry| Self::describe_entry(name, entry, viewer))
    }

    fn list(&self, viewer: &Peer) -> Value {
        let state = self.state.lock().unwrap();
        let enclaves = state.enclaves.iter().map(|(name, entry)| Self::describe_entry(name, entry, viewer)).collect();
        // Why an enclave went (console lines, the VMM's words) is for those who may use it.
        let removed = state
            .removed
            .iter()
            .map(|r| RemovedInfo {
                name: r.name.clone(),
                reason: r.owner.may_use(viewer).then(|| r.reason.clone()),
                at: unix_seconds(r.at),
                owner: owner::user_name(r.owner.uid),
            })
            .collect();
        let free = usable_cores()
            .map(|usable| {
                let taken = state.taken_cores();
                format_cpu_list(usable.into_iter().filter(|c| !taken.contains_key(c)))
            })
            .unwrap_or_default();
        ok_reply(&LsReply { enclaves, removed, free_cores: free })
    }

    fn remove(&self, name: &str, peer: &Peer) -> Value {
        let mut state = self.state.lock().unwrap();
        let Some(entry) = state.enclaves.get(name) else {
            return error_reply(ErrorKind::NotFound, format!("no enclave named {name}; {}", state.known_names()));
        };
        if !entry.owner.may_use(peer) {
            return error_reply(ErrorKind::PermissionDenied, entry.owner.use_refusal(peer, &format!("remove enclave {name}")));
        }
        let owner = entry.owner;
        match &entry.occupant {
            Occupant::Starting => error_reply(ErrorKind::Busy, format!("enclave {name} is still starting; try again in a moment")),
            Occupant::OneShot { pid, .. } => {
                // The job's client hears that its enclave went away; the run cleans up.
                let _ = sys::send_signal(*pid, libc::SIGKILL);
                ok_reply(&RmReply { removed: name.into(), how: "one-shot enclave stopped; its job ends".into() })
            }
            Occupant::Persistent(enclave) => {
                let enclave = enclave.clone();
                state.enclaves.remove(name);
                state.remember_removal(name, owner, "removed on request".into(), enclave.log.clone());
                drop(state);
                let ended = enclave.stop();
                self.release_cpuset(name);
                log::info!("removed enclave {name}: {ended}");
                ok_reply(&RmReply { removed: name.into(), how: ended })
            }
        }
    }

    /// An enclave's log, for those who may use the enclave; the lines about a job (its
    /// arguments) only its owner and root read. A one-shot enclave's log is all its job's.
    fn logs(&self, name: &str, peer: &Peer) -> Value {
        let state = self.state.lock().unwrap();
        let owner = match state.enclaves.get(name) {
            Some(entry) => Some(entry.owner),
            None => state.removed.iter().rev().find(|r| r.name == name).map(|r| r.owner),
        };
        if let Some(owner) = owner.filter(|owner| !owner.may_use(peer)) {
            return error_reply(ErrorKind::PermissionDenied, owner.use_refusal(peer, &format!("read the log of enclave {name}")));
        }
        let (lines, removed) = match state.enclaves.get(name) {
            Some(Entry { occupant: Occupant::Persistent(enclave), .. }) => (enclave.log.lines_for(peer.uid), None),
            Some(Entry { occupant: Occupant::OneShot { log, .. }, .. }) => (log.lines_for(peer.uid), None),
            Some(Entry { occupant: Occupant::Starting, .. }) => (Vec::new(), None),
            None => match state.removed.iter().rev().find(|r| r.name == name) {
                Some(removed) => (removed.log.lines_for(peer.uid), Some(removed.reason.clone())),
                None => return error_reply(ErrorKind::NotFound, format!("no enclave named {name}; {}", state.known_names())),
            },
        };
        ok_reply(&LogsReply { name: name.into(), lines, removed })
    }

    /// Tears every enclave down (the daemon is exiting): persistent ones are stopped, one-shot
    /// machines killed; the clients of their jobs get errors.
    pub fn shut_down_all(&self) {
        let entries: Vec<(String, Entry)> = std::mem::take(&mut self.state.lock().unwrap().enclaves).into_iter().collect();
        for (name, entry) in entries {
            match entry.occupant {
                Occupant::Persistent(enclave) => {
                    let ended = enclave.stop();
                    self.release_cpuset(&name);
                    log::info!("removed enclave {name}: {ended}");
                }
                Occupant::OneShot { pid, .. } => {
                    let _ = sys::send_signal(pid, libc::SIGKILL);
                    log::info!("stopped one-shot enclave {name} (clowder-vmm pid {pid})");
                }
                // Its creator finds the name gone and stops the machine it was starting.
                Occupant::Starting => {}
            }
        }
        // Every host task goes back where it was, with every core.
        if let Ok(cpusets) = &self.cpusets {
            match cpusets.dissolve() {
                Ok(done) => log::info!("{done}"),
                Err(e) => log::error!("returning host tasks to the root cpuset: {e}"),
            }
        }
    }

    fn run(self: &Arc<Self>, request: RunRequest, files: Vec<File>, peer: &Peer, events: &mut dyn EventSink) -> Value {
        if files.len() != RUN_FIXED_FDS + request.files.len() {
            return error_reply(
                ErrorKind::InvalidArgument,
                format!(
                    "`run` carries {} file descriptors; it needs {} (the binary, the working directory, then one per input file)",
                    files.len(),
                    RUN_FIXED_FDS + request.files.len()
                ),
            );
        }
        let mut files = files.into_iter();
        let binary = files.next().expect("counted above");
        let cwd_dir = files.next().expect("counted above");
        let inputs: Vec<JobFile> = request.files.iter().cloned().zip(files).map(|(name, file)| JobFile { name, file }).collect();
        match request.enclave.clone() {
            Some(name) => {
                let files = RunFiles { binary, cwd_dir, inputs };
                self.run_in_enclave(&name, request, files, peer, events)
            }
            None if !inputs.is_empty() => error_reply(
                ErrorKind::InvalidArgument,
                "input files need a persistent enclave (clowder run --enclave NAME): a one-shot enclave only receives the binary",
            ),
            // Its libraries are read from the host as a persistent enclave's jobs read them.
            None if matches!(crate::executable::check(&binary), Ok(Some(_))) => {
                self.run_in_transient_enclave(request, RunFiles { binary, cwd_dir, inputs }, peer, events)
            }
            None => self.run_one_shot(request, binary, peer, events),
        }
    }

    fn run_in_enclave(&self, name: &str, request: RunRequest, files: RunFiles, peer: &Peer, events: &mut dyn EventSink) -> Value {
        let (enclave, enclave_confine) = {
            let state = self.state.lock().unwrap();
            match state.enclaves.get(name) {
                Some(entry) if !entry.owner.may_use(peer) => {
                    return error_reply(ErrorKind::PermissionDenied, entry.owner.use_refusal(peer, &format!("run jobs in enclave {name}")))
                }
                Some(Entry { occupant: Occupant::Persistent(enclave), confine, .. }) => (enclave.clone(), confine.clone()),
                Some(_) => {
                    return error_reply(
                        ErrorKind::Busy,
                        format!("enclave {name} is not ready for jobs (it is starting, or a one-shot enclave)"),
                    )
                }
                None => return error_reply(ErrorKind::NotFound, format!("no enclave named {name}; {}", state.known_names())),
            }
        };
        let interpreter = match crate::executable::check(&files.binary) {
            Ok(interpreter) => interpreter,
            Err(problem) => return error_reply(ErrorKind::InvalidArgument, format!("{} {problem}", request.argv[0])),
        };
        let cores = match request.cores {
            None => 0,
            Some(CoreRequest::Count(count)) if count <= enclave.cores.len() && count < 64 => (1u64 << count) - 1,
            Some(CoreRequest::Count(count)) => {
                return error_reply(
                    ErrorKind::InvalidArgument,
                    format!("asked for {count} cores; enclave {name} has {}", enclave.cores.len()),
                )
            }
            Some(CoreRequest::Exactly(_)) => {
                return error_reply(
                    ErrorKind::InvalidArgument,
                    format!("in enclave {name}, give --cores as a count (it has {})", enclave.cores.len()),
                )
            }
        };
        let owner = Identity { uid: peer.uid, gid: peer.gid, groups: peer.groups.clone() };
        let scope = match job_scope(enclave_confine.as_deref(), request.confine.as_deref(), &request.cwd, &owner) {
            Ok(scope) => scope,
            Err(e) => return error_reply(ErrorKind::InvalidArgument, e),
        };
        let mut inputs = files.inputs;
        if let Some(path) = interpreter {
            // Sent with the program: the kernel's loader finds it among the job's files.
            match crate::executable::open_interpreter(&path, &owner) {
                Ok(file) => inputs.push(JobFile { name: path, file }),
                Err(_) => {
                    // What a Linux shell says and returns when execve finds no interpreter.
                    let message = format!("{}: cannot execute: required file not found\n", request.argv[0]);
                    let _ = events.send(&ApiJobEvent::output(Stream::Stderr, message.as_bytes()));
                    return ok_reply(&RunReply::exited(127, None, None));
                }
            }
        }
        // A job id only for a job that is sent: refused runs leave no gap in the numbering.
        let job = {
            let mut state = self.state.lock().unwrap();
            state.next_job = state.next_job.wrapping_add(1);
            state.next_job
        };
        let binary_name = request.argv[0].rsplit('/').next().unwrap_or("job").to_string();
        let spec = JobSpec {
            argv: request.argv.clone(),
            env: crate::owner::with_login_environment(request.env, peer.uid),
            cwd: request.cwd,
            cwd_dir: files.cwd_dir,
            limits: crate::sockets::UserLimits::of_process(peer.pid),
            launcher: u32::try_from(peer.pid).unwrap_or(0),
            owner,
            scope,
            cores,
            heap: request.heap.unwrap_or(0),
            binary: JobFile { name: if binary_name.is_empty() { "job".into() } else { binary_name }, file: files.binary },
            inputs,
        };
        let (sender, receiver) = mpsc::channel();
        if let Err(e) = enclave.launch(job, spec, sender) {
            return error_reply(ErrorKind::Failed, format!("cannot launch the job in enclave {name}: {e}"));
        }
        // The client went away: end its job rather than run it for nobody (once).
        let mut killed = false;
        let mut end_for_nobody = |events: &dyn EventSink, failed_send: bool| {
            if !killed && (failed_send || events.client_gone()) {
                killed = true;
                enclave.kill_job(job);
            }
        };
        let started = ApiJobEvent::Started { enclave: name.into(), job: Some(job), pid: None, cores: None };
        let failed = events.send(&started).is_err();
        end_for_nobody(&*events, failed);
        loop {
            let event = match receiver.recv_timeout(CLIENT_CHECK_INTERVAL) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    end_for_nobody(&*events, false);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return error_reply(ErrorKind::Internal, format!("enclave {name} dropped job {job} without a word"))
                }
            };
            let line = match event {
                JobEvent::Started => continue,
                JobEvent::Output { stream, data } => {
                    ApiJobEvent::output(if stream == enclave_proto::Stream::Stderr { Stream::Stderr } else { Stream::Stdout }, &data)
                }
                JobEvent::Exited { status } => return ok_reply(&RunReply::exited(status, Some(job), None)),
                JobEvent::Failed { reason } => return error_reply(ErrorKind::Failed, reason),
            };
            let failed = events.send(&line).is_err();
            end_for_nobody(&*events, failed);
        }
    }

    /// A one-shot run of a dynamically linked program: a persistent enclave made for the job
    /// (named, sized and placed as a one-shot enclave) and removed once it has ended.
    fn run_in_transient_enclave(self: &Arc<Self>, request: RunRequest, files: RunFiles, peer: &Peer, events: &mut dyn EventSink) -> Value {
        let name = {
            let mut state = self.state.lock().unwrap();
            state.next_oneshot += 1;
            one_shot_name(state.next_oneshot)
        };
        let create = CreateRequest {
            name: name.clone(),
            cores: request.cores.clone().unwrap_or(CoreRequest::Count(1)),
            memory: request.memory.unwrap_or(self.config.oneshot_memory),
            hugepages: false,
            share_group: None,
            progress: false,
            confine: None,
            linux: None,
        };
        let created = self.create(create, peer, events);
        if created["ok"] != Value::Bool(true) {
            return created;
        }
        // The job has the enclave's cores, as a one-shot job has its machine's.
        let reply = self.run_in_enclave(&name, RunRequest { cores: None, ..request }, files, peer, events);
        self.remove(&name, peer);
        reply
    }

    fn run_one_shot(&self, request: RunRequest, binary: File, peer: &Peer, events: &mut dyn EventSink) -> Value {
        if let Some(refusal) = refuse_unrunnable(&request.argv[0], &binary) {
            return refusal;
        }
        let env = crate::owner::with_login_environment(request.env, peer.uid);
        let command_line = match kernel_command_line(&request.argv, &env, request.heap) {
            Ok(line) => line,
            Err(e) => return error_reply(ErrorKind::InvalidArgument, e),
        };
        let name = {
            let mut state = self.state.lock().unwrap();
            state.next_oneshot += 1;
            one_shot_name(state.next_oneshot)
        };
        let memory = request.memory.unwrap_or(self.config.oneshot_memory);
        let core_request = request.cores.clone().unwrap_or(CoreRequest::Count(1));
        let owner = Owner::of(peer);
        let (cores, id_block) = match self.reserve(&name, owner, &core_request, memory, false, None) {
            Ok(reserved) => reserved,
            Err(e) => return e.reply(),
        };
        let log = Arc::new(LogBook::new(2000));
        let spec = MachineSpec { name: name.clone(), cores: cores.clone(), memory, hugepages: false, id_block };
        let mut machine = match OneShot::start(&self.config.vmm, &self.config.kernel, &spec, binary, &command_line, log.clone()) {
            Ok(machine) => machine,
            Err(e) => {
                self.state.lock().unwrap().enclaves.remove(&name);
                return error_reply(ErrorKind::Failed, e);
            }
        };
        let pid = machine.pid();
        log.push(format!("clowderd: one-shot enclave {name}: clowder-vmm pid {pid}, cores {}", format_cpu_list(cores.iter().copied())));
        let registered = match self.state.lock().unwrap().enclaves.get_mut(&name) {
            Some(entry) => {
                entry.occupant = Occupant::OneShot { pid, log: log.clone(), job: request.argv[0].clone() };
                true
            }
            None => false,
        };
        if !registered {
            // The daemon tore everything down while this machine was starting.
            machine.kill();
        }
        let started =
            ApiJobEvent::Started { enclave: name.clone(), job: None, pid: Some(pid), cores: Some(format_cpu_list(cores.iter().copied())) };
        let mut client_gone = events.send(&started).is_err();
        loop {
            let event = match machine.next_event(CLIENT_CHECK_INTERVAL) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if !client_gone && events.client_gone() {
                        client_gone = true;
                        machine.kill();
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let line = match event {
                RunEvent::Output(bytes) => {
                    log.push(format!("console: {}", String::from_utf8_lossy(&bytes).trim_end()));
                    ApiJobEvent::output(Stream::Stdout, &bytes)
                }
                RunEvent::KernelLine(text) => {
                    log.push(format!("[lwk] {text}"));
                    ApiJobEvent::Log { text }
                }
            };
            if !client_gone && events.send(&line).is_err() {
                client_gone = true;
                machine.kill();
            }
        }
        let outcome = machine.finish();
        let mut state = self.state.lock().unwrap();
        state.enclaves.remove(&name);
        match outcome {
            Ok(status) => ok_reply(&RunReply::exited(status, None, Some(name))),
            Err(reason) => {
                log.push(format!("clowderd: {reason}"));
                state.remember_removal(&name, owner, reason.clone(), log);
                drop(state);
                log::warn!("one-shot enclave {name} failed: {reason}");
                error_reply(ErrorKind::Failed, format!("one-shot enclave {name} failed: {reason}"))
            }
        }
    }
}

/// Which host files a job may name: any its user may, or, with the enclave's and/or the run's
/// confinement, those beneath that directory (the run's must lie within the enclave's).
fn job_scope(enclave: Option<&str>, run: Option<&str>, cwd: &str, owner: &Identity) -> Result<Scope, String> {
    let outer = enclave.map(|dir| Scope::confined(dir, cwd, owner, None)).transpose()?;
    match run {
        Some(dir) => Scope::confined(dir, cwd, owner, outer.as_ref()),
        None => Ok(outer.unwrap_or(Scope::User)),
    }
}

/// The error reply for a program (`program`, the run's argv[0]) that a one-shot enclave cannot
/// run, said before one boots for it (see `executable`).
fn refuse_unrunnable(program: &str, binary: &File) -> Option<Value> {
    let problem = crate::executable::check(binary).err()?;
    Some(error_reply(ErrorKind::InvalidArgument, format!("{program} {problem}")))
}
