//! XEMEM between the host and its enclaves: the daemon runs the name server's
//! `xemem::node::Node` (enclave 1) with one link per persistent enclave, carried on the
//! enclave channel as `enclave_proto` `Xemem` messages (an encoded `xemem::wire::Message`
//! each way, docs/xemem.md).
//!
//! Each enclave's pump thread owns an [`XememPort`]: it hands what the enclave sent to
//! [`XememPort::from_enclave`], sends what [`XememPort::to_enclave`] returns, and calls
//! [`XememPort::tick`] on every round. Dropping the port (the enclave failed or was removed)
//! takes the link down, and the name server forgets that enclave's segments and permits.
//!
//! Validation is the `xemem` crate's: a message that does not decode is answered with
//! `Failed` (EPROTO) by the node, never acted on.
//!
//! Enclave memory for host processes ([`XememLinks::attach_enclave_segment`]): the owner
//! enclave answers an attach with guest-physical frame runs; every run is checked against
//! that enclave's RAM (outside its channel) and becomes a range of the enclave's RAM memfd,
//! which a host process can map: no copy.
//!
//! Host memory for enclaves ([`XememPort`]'s bridge): host processes' segments live in the
//! broker's name server (`xemem-host`), not this node's (their names are one table with the
//! node's: [`XememLinks::set_broker`]), so an enclave's get, attach, detach and release about
//! them are served here from the broker; an attach adds the owner's
//! memfd runs to the enclave as guest-physical regions (its VMM's `add_region`) and answers
//! with their frames. When the owner removes the segment or exits, the broker asks
//! ([`xemem_host::Enclaves::revoke`]) before the memory goes: the daemon sends the holder's
//! enclave a `Revoke`, the enclave unmaps the attachment and answers `Revoked`, and only then
//! (or when the enclave is gone, or after [`REVOKE_TIMEOUT`]) are the regions removed and
//! the broker may let the owner's memory be truncated.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xemem::ids::{AccessId, EnclaveId, SegmentId, NAME_SERVER_ENCLAVE};
use xemem::node::{Completion, LinkId, LocalMemory, Node, Reply, Request, Timing};
use xemem::wire::{Body, FrameRun, MappingWord, Message, Name};
use xemem::{Credentials, Error, NameServer, Principal};

use crate::guest_ram::GuestRam;
use crate::machine::{RegionAccess, SharedRegion};
use crate::xemem_peer::FrameSource;

/// How long a host-side request may wait for the enclaves' answers.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How many enclaves can be linked at once (link ids are reused after a link goes down).
const MAX_LINKS: u32 = 4096;

/// The host's own memory as the node sees it: none yet (host segments are the broker's).
struct NoHostMemory;

impl LocalMemory for NoHostMemory {
    fn resolve(&mut self, _process: u64, _vaddr: u64, _size: u64) -> Result<Vec<FrameRun>, Error> {
        Err(Error::NotFound)
    }
    fn notify(&mut self, _process: u64, _segment: SegmentId) {}
    fn revoke(&mut self, _process: u64, _access: AccessId) {}
}

struct Links {
    node: Node,
    /// Where to put each link's outgoing messages (its pump sends them).
    outgoing: HashMap<LinkId, Outbox>,
    /// Each link's bridged permits (shared with its port), for revocation.
    bridges: HashMap<LinkId, Arc<Mutex<Bridge>>>,
    /// Each link's notices of segments and enclaves that went away.
    gone: HashMap<LinkId, mpsc::Sender<Gone>>,
    /// The memory behind each link's frame numbers: an enclave's RAM, or the files a peer
    /// daemon passed (`xemem_peer`). Frame runs from the link are checked against it.
    ram: HashMap<LinkId, Arc<dyn FrameSource>>,
    /// Finished requests of host callers, until they collect them.
    finished: HashMap<u64, Result<Reply, Error>>,
    /// What owner enclaves answered to this daemon's attaches, for repeating them.
    owner_runs: OwnerRuns,
}

/// Frames owner enclaves resolved for the daemon's attaches (its host processes' and its
/// bridges'), kept while the owner kernel's count of page-table changes has not moved
/// ([`FrameSource::mapping_changes`]): attaching the same range again then takes no round
/// trip through the owner's kernel, whose code this machine emulates (milliseconds). The
/// name server still checks and counts every attach; the runs are checked against the
/// owner's RAM again as any answer is.
#[derive(Default)]
struct OwnerRuns {
    entries: VecDeque<OwnerRunsEntry>,
}

struct OwnerRunsEntry {
    /// The owner's RAM when it answered: an enclave id may later name another enclave.
    ram: std::sync::Weak<dyn FrameSource>,
    owner: Principal,
    vaddr: u64,
    size: u64,
    changes: u64,
    runs: Vec<FrameRun>,
}

/// How many owner answers are kept (the oldest goes first).
const OWNER_RUNS_KEPT: usize = 64;

/// An attach the name server would plan now, with the owner's RAM and its count of changes.
struct OwnerProbe {
    plan: xemem::nameserver::AttachPlan,
    ram: Arc<dyn FrameSource>,
    changes: u64,
}

impl OwnerRuns {
    fn recall(&self, probe: &OwnerProbe) -> Option<Vec<FrameRun>> {
        self.entries.iter().find(|e| e.answers(probe) && e.changes == probe.changes).map(|e| e.runs.clone())
    }

    fn keep(&mut self, probe: OwnerProbe, runs: Vec<FrameRun>) {
        self.entries.retain(|e| !e.answers(&probe) && e.ram.strong_count() > 0);
        if self.entries.len() >= OWNER_RUNS_KEPT {
            self.entries.pop_front();
        }
        let plan = probe.plan;
        self.entries.push_back(OwnerRunsEntry { ram: Arc::downgrade(&probe.ram), owner: plan.owner, vaddr: plan.vaddr, size: plan.size, changes: probe.changes, runs });
    }
}

impl OwnerRunsEntry {
    /// Whether this is the same owner's answer for the same range (whatever its count).
    fn answers(&self, probe: &OwnerProbe) -> bool {
        std::ptr::addr_eq(self.ram.as_ptr(), Arc::as_ptr(&probe.ram)) && self.owner == probe.plan.owner && self.vaddr == probe.plan.vaddr && self.size == probe.plan.size
    }
}

pub struct XememLinks {
    links: Mutex<Links>,
    /// The host's broker, where host processes' segments live: enclaves' requests about them
    /// go there (set once the daemon has a broker).
    broker: std::sync::OnceLock<xemem_host::Broker>,
    /// The daemon's broker, name server's or sub-manager's, for revoking its host processes'
    /// attachments of segments that go ([`XememLinks::set_attachers`]).
    attachers: std::sync::OnceLock<xemem_host::Broker>,
    /// Signalled whenever requests finish.
    finished: Condvar,
    started: Instant,
    /// Process numbers the daemon takes permits under for enclave processes (see [`Source`]).
    next_proxy: std::sync::atomic::AtomicU64,
    /// How many times a sub-manager lost its link towards the name server.
    upstream_losses: std::sync::atomic::AtomicU64,
    /// Attaches served to enclaves through bridged permits (host processes' or other
    /// enclaves' memory), each a round trip through the enclave's kernel.
    bridged_attaches: std::sync::atomic::AtomicU64,
}

/// A piece of an attached enclave segment: a range of the enclave's RAM memfd, or a hole
/// (nothing mapped at the source).
#[derive(Debug)]
pub enum FileRun {
    Memory { file: File, offset: u64, len: u64 },
    Hole { len: u64 },
}

impl Default for XememLinks {
    fn default() -> Self {
        XememLinks::with_node(true)
    }
}

impl XememLinks {
    /// The name server's node (enclave 1), or with `name_server` false a sub-manager's, which
    /// finds the name server through a daemon link (`xemem_peer`) and gets an id from it.
    fn with_node(name_server: bool) -> Self {
        XememLinks {
            // Retries in milliseconds: the enclave's answers come within a ping round.
            links: Mutex::new(Links {
                // A random instance: a restarted daemon's enclave ids, segids and apids are
                // not the ones it handed out before (stale ones are not found).
                node: Node::new(MAX_LINKS, name_server.then(|| NameServer::new(xemem_host::sys::random_instance())), Timing { retry_after: 500, attempts: 5 }),
                outgoing: HashMap::new(),
                bridges: HashMap::new(),
                gone: HashMap::new(),
                ram: HashMap::new(),
                finished: HashMap::new(),
                owner_runs: OwnerRuns::default(),
            }),
            finished: Condvar::new(),
            broker: std::sync::OnceLock::new(),
            attachers: std::sync::OnceLock::new(),
            started: Instant::now(),
            next_proxy: std::sync::atomic::AtomicU64::new(FIRST_PROXY_PROCESS),
            upstream_losses: std::sync::atomic::AtomicU64::new(0),
            bridged_attaches: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl XememLinks {
    pub fn new() -> Arc<XememLinks> {
        Arc::new(XememLinks::default())
    }

    /// A sub-manager daemon's node: not the name server (see `xemem_peer`).
    pub fn sub_manager() -> Arc<XememLinks> {
        Arc::new(XememLinks::with_node(false))
    }

    /// Whether this node is the name server (enclave 1), not a sub-manager's.
    pub fn is_name_server(&self) -> bool {
        self.links.lock().unwrap().node.name_server().is_some()
    }

    /// The link this node found the name server on (a sub-manager's upstream link).
    pub(crate) fn link_towards_name_server(&self) -> Option<LinkId> {
        self.links.lock().unwrap().node.link_towards_name_server()
    }

    /// How many times this sub-manager lost its link towards the name server (and with it
    /// its id): links to daemons below made before the last loss speak for ids that are void.
    pub(crate) fn upstream_losses(&self) -> u64 {
        self.upstream_losses.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How many attaches enclaves made through bridged permits so far (an LWK job's attach of a
    /// range it parked is not one: its kernel does not ask).
    pub fn bridged_attaches(&self) -> u64 {
        self.bridged_attaches.load(std::sync::atomic::Ordering::Acquire)
    }

    /// This node's enclave id, once it has one.
    pub fn id(&self) -> Option<EnclaveId> {
        self.links.lock().unwrap().node.id()
    }

    /// The memory behind the frames of `enclave`'s messages: the link it lies behind (or, for
    /// an enclave we have no route to, such as the name server, the link towards the name
    /// server).
    pub(crate) fn frame_source(&self, enclave: EnclaveId) -> Option<Arc<dyn FrameSource>> {
        let links = self.links.lock().unwrap();
        let link = links.node.route(enclave).or(links.node.link_towards_name_server())?;
        links.ram.get(&link).cloned()
    }

    /// Gives enclaves a way to host processes' segments (the daemon's broker), and makes one
    /// name space of the broker's and this node's name servers: they share one name table,
    /// so a name held by a host process or by any enclave (or sub-manager) is refused to
    /// everyone else, and lookups on either side find its first holder. Once only.
    pub fn set_broker(&self, broker: xemem_host::Broker) {
        if self.broker.get().is_some() {
            return;
        }
        let names = xemem_host::SharedNames::default();
        if let Some(ns) = self.links.lock().unwrap().node.name_server_mut() {
            // Into a fresh table: no name of the node's can be lost.
            let _ = ns.share_names(Box::new(names.clone()));
        }
        broker.share_names(names);
        let _ = self.broker.set(broker);
    }

    /// The broker whose host processes attach other enclaves' segments through this node
    /// (every daemon's, a sub-manager's too): their attachments are revoked when those
    /// segments go.
    pub fn set_attachers(&self, broker: xemem_host::Broker) {
        let _ = self.attachers.set(broker);
    }

    /// Starts `request` for host process `process` and waits for its answer.
    fn call(&self, request: Request) -> Result<Reply, Error> {
        let mut links = self.links.lock().unwrap();
        let now = self.now();
        links.node.tick(now, &mut NoHostMemory);
        let id = links.node.request(request, &mut NoHostMemory)?;
        self.deliver(&mut links);
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Some(result) = links.finished.remove(&id) {
                return result;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Unreachable);
            }
            links = self.finished.wait_timeout(links, left.min(Duration::from_millis(50))).unwrap().0;
            // The node retries on its own clock; the pumps tick it too.
            let now = self.now();
            links.node.tick(now, &mut NoHostMemory);
            self.deliver(&mut links);
        }
    }

    /// The segments of the enclaves (the name server's own listing; host processes' segments
    /// are the broker's).
    pub fn list(&self) -> Vec<xemem::nameserver::Listing> {
        let links = self.links.lock().unwrap();
        links.node.name_server().map(|ns| ns.list(0, usize::MAX)).unwrap_or_default()
    }

    /// A named segment's id (enclave segments are made with names by XEMEM's `xemem_make`).
    pub fn lookup(&self, name: &str) -> Result<SegmentId, Error> {
        let name = Name::new(name.as_bytes())?;
        match self.call(Request::Lookup { name })? {
            Reply::Found(segment) => Ok(segment),
            _ => Err(Error::Malformed),
        }
    }

    /// Attaches `[offset, offset + size)` of an enclave's segment for host process `process`
    /// (credentials `uid`/`groups`): a read-write permit is taken, the owner enclave answers
    /// with frame runs, and each run comes back as a range of that enclave's RAM memfd. A run
    /// outside the owner's RAM (or over its channel) fails the whole attach with EINVAL.
    /// The permit stays granted; [`XememLinks::release`] gives it back.
    pub fn attach_enclave_segment(
        &self,
        process: u64,
        credentials: Credentials,
        segment: SegmentId,
        offset: u64,
        size: u64,
    ) -> Result<(AccessId, Vec<FileRun>), Error> {
        let access = match self.call(Request::Get { process, segment, access: xemem::ACCESS_READ_WRITE, credentials })? {
            Reply::Granted { access, .. } => access,
            _ => return Err(Error::Malformed),
        };
        let runs = match self.owner_runs(process, access, offset, size) {
            Ok((_, runs, _)) => runs,
            Err(error) => {
                let _ = self.release(process, access);
                return Err(error);
            }
        };
        let ram = self.owner_ram(segment);
        let Some(ram) = ram else {
            let _ = self.release(process, access);
            return Err(Error::Unreachable);
        };
        match file_runs(&*ram, &runs) {
            Ok(file_runs) => Ok((access, file_runs)),
            Err(error) => {
                let _ = self.call(Request::Detach { process, access });
                let _ = self.release(process, access);
                Err(error)
            }
        }
    }

    pub fn release(&self, process: u64, access: AccessId) -> Result<(), Error> {
        self.call(Request::Release { process, access }).map(|_| ())
    }

    /// The memory behind the frames of `segment`'s owner, while it is linked.
    fn owner_ram(&self, segment: SegmentId) -> Option<Arc<dyn FrameSource>> {
        self.frame_source(segment.enclave())
    }
}

/// The broker's way to other enclaves: a host process's requests about their segments.
impl xemem_host::Enclaves for XememLinks {
    fn lookup(&self, name: &Name) -> Result<SegmentId, Error> {
        match self.call(Request::Lookup { name: name.clone() })? {
            Reply::Found(segment) => Ok(segment),
            _ => Err(Error::Malformed),
        }
    }

    fn get(&self, process: u64, credentials: Credentials, segment: SegmentId, access: u32) -> Result<(AccessId, u64), Error> {
        match self.call(Request::Get { process, segment, access, credentials })? {
            Reply::Granted { access, size } => Ok((access, size)),
            _ => Err(Error::Malformed),
        }
    }

    fn attach(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Result<Vec<xemem_host::EnclaveRun>, Error> {
        self.attach_enclave_memory(process, access, offset, size).map(|(_, runs, _)| runs)
    }

    fn detach(&self, process: u64, access: AccessId) -> Result<(), Error> {
        self.call(Request::Detach { process, access }).map(|_| ())
    }

    fn release(&self, process: u64, access: AccessId) -> Result<(), Error> {
        XememLinks::release(self, process, access)
    }

    /// Sends each holder's enclave a `Revoke` for the attachment made through the permit and
    /// waits for the acknowledgements (the pumps remove the regions as they come). A permit
    /// with no attachment just goes; an enclave that is gone holds nothing any more.
    fn signal(&self, process: u64, access: AccessId) -> Result<(), Error> {
        self.call(Request::Signal { process, access }).map(|_| ())
    }

    fn revoke(&self, permits: &[(Principal, AccessId)]) {
        let waiter = Arc::new(Outstanding::default());
        for (holder, broker_access) in permits {
            let found = {
                let links = self.links.lock().unwrap();
                links.node.route(holder.enclave).and_then(|link| Some((links.bridges.get(&link)?.clone(), links.outgoing.get(&link)?.clone())))
            };
            let Some((bridge, queue)) = found else { continue };
            let is_this_permit = |enclave: EnclaveId, process: u64, permit: &BridgedPermit| {
                enclave == holder.enclave && process == holder.process && matches!(permit.source, Source::Host { broker_access: b } if b == *broker_access)
            };
            bridge.lock().unwrap().revoke_where(is_this_permit, &queue, &waiter);
        }
        // The pumps enforce the deadline; the slack covers a pump's round.
        waiter.wait(REVOKE_TIMEOUT + Duration::from_secs(1));
    }

    /// A sub-manager's host process makes a segment at the name server.
    fn make(&self, process: u64, vaddr: u64, size: u64, owner: xemem::Owner, name: Option<Name>) -> Result<SegmentId, Error> {
        match self.call(Request::Make { process, vaddr, size, owner, name })? {
            Reply::Made(segment) => Ok(segment),
            _ => Err(Error::Malformed),
        }
    }

    fn remove(&self, process: u64, segment: SegmentId) -> Result<(), Error> {
        self.call(Request::Remove { process, segment })?;
        // The owner's library truncates the memory once it has the answer: this daemon's
        // enclaves that attached it let go first.
        self.revoke_segments(&[segment]);
        Ok(())
    }
}

impl XememLinks {
    /// Attaches through `access`, a permit the daemon's node granted to `process`: the owner
    /// enclave's frame runs, each checked against its RAM and named as a range of its RAM
    /// memfd, and where the owner kernel's count of page-table changes lies with the value
    /// the runs hold while (when the owner publishes one and it stood still while they were
    /// had). Any failure detaches again.
    fn attach_enclave_memory(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Result<(SegmentId, Vec<xemem_host::EnclaveRun>, Option<OwnerCount>), Error> {
        let (segment, runs, count) = self.owner_runs(process, access, offset, size)?;
        let checked = self.owner_ram(segment).ok_or(Error::Unreachable).and_then(|ram| file_runs(&*ram, &runs));
        let runs = match checked {
            Ok(runs) => runs,
            Err(error) => {
                let _ = self.call(Request::Detach { process, access });
                return Err(error);
            }
        };
        let runs = runs
            .into_iter()
            .map(|run| match run {
                FileRun::Memory { file, offset, len } => xemem_host::EnclaveRun::Memory { file: file.into(), offset, length: len },
                FileRun::Hole { len } => xemem_host::EnclaveRun::Hole { length: len },
            })
            .collect();
        Ok((segment, runs, count))
    }

    /// The owner's frames for an attach through this daemon's permit `access`: kept from an
    /// earlier attach of the same range while the owner kernel changed no mapping since (the
    /// name server counts the attach as if the owner had answered), else asked of the owner,
    /// whose answer is kept when no mapping changed while it was asked. With them, when the
    /// owner publishes its count of changes and it stood still: the owner's RAM and the count
    /// the runs hold while.
    fn owner_runs(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Result<OwnerAnswer, Error> {
        let probe = {
            let mut links = self.links.lock().unwrap();
            let probe = links.probe_owner(process, access, offset, size);
            if let Some(probe) = probe.as_ref() {
                if let Some((segment, runs)) = links.attach_from_kept(probe, process, access, offset, size) {
                    return Ok((segment, runs, Some(OwnerCount { ram: probe.ram.clone(), value: probe.changes })));
                }
            }
            probe
        };
        let (segment, runs) = match self.call(Request::Attach { process, access, offset, size })? {
            Reply::Attached { segment, runs, .. } => (segment, runs),
            _ => return Err(Error::Malformed),
        };
        let mut count = None;
        if let Some(probe) = probe {
            if probe.plan.segment == segment && probe.ram.mapping_changes() == Some(probe.changes) {
                count = Some(OwnerCount { ram: probe.ram.clone(), value: probe.changes });
                self.links.lock().unwrap().owner_runs.keep(probe, runs.clone());
            }
        }
        Ok((segment, runs, count))
    }

    /// The name server takes back a permit this daemon holds as `proxy` (a sub-manager's proxy
    /// permit on a segment upstream): every enclave attachment made through it is revoked, and
    /// this waits until the enclaves acknowledged (or are gone, or the deadline passed), so
    /// the acknowledgement upstream means nothing here maps the memory any more.
    pub(crate) fn revoke_proxy_permit(&self, proxy: u64, access: AccessId) {
        self.revoke_bridged(|permit| matches!(permit.source, Source::Enclave { access: a, proxy: p } if a == access && p == proxy));
    }

    /// Revokes every enclave attachment bridged on `segments` (other enclaves' or daemons')
    /// and waits for the acknowledgements, as [`XememLinks::revoke_proxy_permit`] does.
    pub(crate) fn revoke_segments(&self, segments: &[SegmentId]) {
        self.revoke_bridged(|permit| matches!(permit.source, Source::Enclave { .. }) && segments.contains(&permit.segment));
    }

    fn revoke_bridged(&self, which: impl Fn(&BridgedPermit) -> bool) {
        let waiter = Arc::new(Outstanding::default());
        let ports: Vec<LinkId> = self.links.lock().unwrap().bridges.keys().copied().collect();
        for link in ports {
            let found = {
                let links = self.links.lock().unwrap();
                links.bridges.get(&link).cloned().zip(links.outgoing.get(&link).cloned())
            };
            if let Some((bridge, queue)) = found {
                bridge.lock().unwrap().revoke_where(|_, _, permit| which(permit), &queue, &waiter);
            }
        }
        waiter.wait(REVOKE_TIMEOUT + Duration::from_secs(1));
    }

    /// An enclave behind a daemon link went away (that daemon's link to it, or the daemon
    /// itself below a surviving one): permits bridged on its segments are revoked on every
    /// link, and host processes here attached to them have their libraries remap the
    /// attachments (SIGBUS), since nothing is left to truncate the owners' memory.
    fn enclave_went_away(&self, enclave: EnclaveId) {
        XememLinks::announce(&self.links.lock().unwrap(), Gone::Enclave(enclave));
        if let Some(broker) = self.attachers.get().cloned() {
            // The libraries may take a while to answer: not on the link's pump.
            let _ = std::thread::Builder::new().name("xemem-gone".into()).spawn(move || {
                broker.revoke_remote(|segment| segment.enclave() == enclave);
            });
        }
        if let Some(broker) = self.broker.get() {
            broker.forget_enclave(enclave);
        }
    }

    /// The permits on `segments` that the name server granted to daemons below (to their host
    /// processes, or to their bridges as proxies for their enclaves): it grants them directly
    /// when the owner lies behind the requester's own link (`Bridging::claim`).
    fn daemon_holders(&self, segments: &[SegmentId]) -> Vec<(AccessId, Principal)> {
        let links = self.links.lock().unwrap();
        let Some(ns) = links.node.name_server() else { return Vec::new() };
        let behind_a_daemon = |enclave: EnclaveId| links.node.route(enclave).and_then(|link| links.ram.get(&link)).is_some_and(|frames| frames.is_peer());
        segments.iter().flat_map(|segment| ns.permits_on(*segment)).filter(|(_, holder)| holder.enclave != NAME_SERVER_ENCLAVE && behind_a_daemon(holder.enclave)).collect()
    }

    /// Sends each of `holders` a `Revoke` and waits for the acknowledgements (or the deadline):
    /// the holder's daemon has its host process's library, or its enclaves, let go first.
    fn revoke_daemon_holders(&self, holders: &[(AccessId, Principal)]) {
        if holders.is_empty() {
            return;
        }
        let waiter = Arc::new(Outstanding::default());
        for (access, holder) in holders {
            let found = {
                let links = self.links.lock().unwrap();
                links.node.route(holder.enclave).and_then(|link| Some((links.bridges.get(&link)?.clone(), links.outgoing.get(&link)?.clone())))
            };
            if let Some((bridge, queue)) = found {
                bridge.lock().unwrap().send_revoke(holder.enclave, holder.process, *access, Vec::new(), &queue, &waiter);
            }
        }
        waiter.wait(REVOKE_TIMEOUT + Duration::from_secs(1));
    }

    /// Tells every link's port that `gone` went away (its pump revokes bridged permits on it).
    fn announce(links: &Links, gone: Gone) {
        for sender in links.gone.values() {
            let _ = sender.send(gone);
        }
    }

    /// Detaches at whoever granted a bridged permit (the permit may be gone with its segment).
    fn detach_at_source(&self, caller: Principal, source: Source) {
        match source {
            Source::Host { broker_access } => {
                if let Some(broker) = self.broker.get() {
                    let _ = broker.detach_for_enclave(caller, broker_access);
                }
            }
            Source::Enclave { access, proxy } => {
                let _ = self.call(Request::Detach { process: proxy, access });
            }
        }
    }

    /// Gives a bridged permit back to whoever granted it.
    fn release_at_source(&self, caller: Principal, source: Source) {
        match source {
            Source::Host { broker_access } => {
                if let Some(broker) = self.broker.get() {
                    let _ = broker.release_for_enclave(caller, broker_access);
                }
            }
            Source::Enclave { access, proxy } => {
                let _ = self.call(Request::Release { process: proxy, access });
            }
        }
    }
}

impl XememLinks {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A new enclave's link; `None` when every link id is taken. `ram` is the enclave's RAM;
    /// `wake` an eventfd the enclave's pump sleeps on, signalled whenever a message for the
    /// enclave is queued from another thread.
    pub fn join(self: &Arc<Self>, ram: Arc<GuestRam>, wake: File) -> Option<XememPort> {
        self.join_link(ram, wake, None)
    }

    /// A link to another daemon (`xemem_peer`): `frames` holds the files it passed.
    /// `upstream` says whether it is this sub-manager's link to the daemon above, the only
    /// link the way to the name server may be found on.
    pub(crate) fn join_peer(self: &Arc<Self>, frames: Arc<crate::xemem_peer::PeerFrames>, wake: File, upstream: bool) -> Option<XememPort> {
        let regions: Arc<dyn GuestRegions + Send + Sync> = frames.clone();
        let mut port = self.join_link(frames, wake, Some(regions))?;
        port.upstream = upstream;
        Some(port)
    }

    fn join_link(self: &Arc<Self>, ram: Arc<dyn FrameSource>, wake: File, peer_regions: Option<Arc<dyn GuestRegions + Send + Sync>>) -> Option<XememPort> {
        let peer = peer_regions.is_some();
        let mut links = self.links.lock().unwrap();
        let link = (0..MAX_LINKS).find(|link| !links.outgoing.contains_key(link))?;
        let (sender, receiver) = mpsc::channel();
        links.outgoing.insert(link, Outbox { queue: sender, wake: Arc::new(wake) });
        links.ram.insert(link, ram);
        let bridge = Arc::new(Mutex::new(Bridge::default()));
        links.bridges.insert(link, bridge.clone());
        let (gone_sender, gone) = mpsc::channel();
        links.gone.insert(link, gone_sender);
        Some(XememPort { links: self.clone(), link, outgoing: receiver, gone, bridge, peer, peer_regions, workers: Arc::default(), upstream: false })
    }

    /// The node's messages go to their links' queues; finished requests to their callers.
    fn deliver(&self, links: &mut Links) {
        let completions: Vec<Completion> = links.node.completions();
        if !completions.is_empty() {
            for completion in completions {
                links.finished.insert(completion.request, completion.result);
            }
            self.finished.notify_all();
        }
        for (link, message) in links.node.outbox() {
            let mut bytes = Vec::new();
            if message.encode(&mut bytes).is_err() {
                continue;
            }
            if let Some(queue) = links.outgoing.get(&link) {
                queue.send(bytes);
            }
        }
    }
}

impl Links {
    /// The owner's runs kept for `probe`'s range, the attach counted by the name server.
    fn attach_from_kept(&mut self, probe: &OwnerProbe, process: u64, access: AccessId, offset: u64, size: u64) -> Option<(SegmentId, Vec<FrameRun>)> {
        let runs = self.owner_runs.recall(probe)?;
        let me = self.node.id()?;
        self.node.name_server_mut()?.attach(Principal { enclave: me, process }, access, offset, size).ok()?;
        Some((probe.plan.segment, runs))
    }

    /// What attaching `[offset, offset + size)` through this daemon's `access` would ask of
    /// the owner, when the owner is a linked enclave that publishes its count of changes.
    fn probe_owner(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Option<OwnerProbe> {
        let me = self.node.id()?;
        let plan = self.node.name_server()?.plan_attach(Principal { enclave: me, process }, access, offset, size).ok()?;
        let link = self.node.route(plan.owner.enclave)?;
        let ram = self.ram.get(&link)?.clone();
        let changes = ram.mapping_changes()?;
        Some(OwnerProbe { plan, ram, changes })
    }
}

/// Checks every frame run against the enclave's RAM and names it as a range of the RAM memfd.
/// An enclave whose RAM is on 2 MiB hugetlb pages can share only whole pages: a process can
/// map a hugetlb file only in 2 MiB pieces, and rounding a run out would hand it the
/// enclave's neighbouring memory; such an attach is refused with EINVAL (`WholePagesOnly`,
/// which a host caller's library can name: `xemem_errmsg`), and said once here.
pub fn file_runs(ram: &dyn FrameSource, runs: &[FrameRun]) -> Result<Vec<FileRun>, Error> {
    let page = xemem::PAGE_SIZE;
    let unit = ram.mappable_unit();
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let len = run.frames.checked_mul(page).ok_or(Error::Invalid)?;
        match run.first {
            None => out.push(FileRun::Hole { len }),
            Some(first) => {
                let gpa = first.checked_mul(page).ok_or(Error::Invalid)?;
                let (file, offset) = ram.file_range(gpa, len)?;
                if offset % unit != 0 || len % unit != 0 {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        eprintln!(
                            "clowderd: xemem: an attach of {len:#x} bytes at {gpa:#x} of an enclave whose RAM is on {} KiB pages refused (EINVAL): \
                             another process can map that memory only in whole pages; export segments of whole, aligned 2 MiB pages there \
                             (said once)",
                            unit / 1024
                        )
                    });
                    return Err(Error::WholePagesOnly);
                }
                out.push(FileRun::Memory { file, offset, len });
            }
        }
    }
    Ok(out)
}

/// Where a link's outgoing messages wait for its pump. Queuing one wakes the pump, so a
/// message queued by another thread (a host caller, another enclave's pump, the broker) goes
/// out at once rather than after the pump's receive timeout.
#[derive(Clone)]
struct Outbox {
    queue: mpsc::Sender<Vec<u8>>,
    wake: Arc<File>,
}

impl Outbox {
    fn send(&self, message: Vec<u8>) {
        if self.queue.send(message).is_ok() {
            // Fails only when the counter would overflow: the pump has wake-ups pending.
            let _ = crate::sys::signal_eventfd(&self.wake);
        }
    }
}

/// One enclave's end of the host's node.
pub struct XememPort {
    links: Arc<XememLinks>,
    link: LinkId,
    outgoing: mpsc::Receiver<Vec<u8>>,
    gone: mpsc::Receiver<Gone>,
    bridge: Arc<Mutex<Bridge>>,
    /// A link to another daemon: its frames are files it passed, renumbered on arrival.
    peer: bool,
    /// A daemon link's frame table, where the bridge adds the memory it answers with (the
    /// threads serving that link's bridged requests share it).
    peer_regions: Option<Arc<dyn GuestRegions + Send + Sync>>,
    /// How many of this link's bridged requests are being served on threads.
    workers: Arc<std::sync::atomic::AtomicUsize>,
    /// A sub-manager's link to the daemon above it.
    upstream: bool,
}

/// What an enclave's machine must do for an attach of host memory: make a range of a memfd a
/// new guest-physical region, and take it away again.
pub trait GuestRegions {
    fn add(&self, file: &File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String>;
    fn remove(&self, slot: u32) -> Result<(), String>;
}

/// Enclave processes get host segments as "others": the uid and groups an enclave claims are
/// its own business and mean nothing on the host (LWK jobs all run as root), so only segments
/// whose mode lets everyone in (XEMEM's named segments are 0666) can be had.
const ENCLAVE_PROCESS_CREDENTIALS_UID: u32 = 65534;

/// Bridged permits reach the enclave under ids of their own, above every local id the daemon's
/// name server hands out, so the enclave's node never confuses them with permits of the name
/// server, which also carry enclave 1.
const FIRST_HOST_PERMIT: u32 = xemem::ids::MAX_NAME_SERVER_LOCAL + 1;

/// The daemon takes permits on enclave segments for other enclaves' processes as these
/// process numbers of enclave 1, far above any host pid.
const FIRST_PROXY_PROCESS: u64 = 1 << 40;

/// How many answers to enclaves' bridged requests are kept for their retries.
const BRIDGE_ANSWERS_KEPT: usize = 256;

/// Where a permit the bridge holds for an enclave process comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The broker's permit on a host process's segment.
    Host { broker_access: AccessId },
    /// The daemon's own permit, as process `proxy` of enclave 1, on another enclave's segment:
    /// the owner's frames reach the holder as regions of the owner's RAM memfd, so the holder
    /// never sees (nor needs to be trusted with) the owner's guest-physical addresses.
    Enclave { access: AccessId, proxy: u64 },
}

/// A permit an enclave process holds on memory the daemon maps into its machine.
struct BridgedPermit {
    source: Source,
    segment: SegmentId,
    /// The current attachment, or the last one kept after a detach.
    attachment: Option<BridgedAttachment>,
    /// An attach through it is being served (the bridge's lock is not held meanwhile).
    attaching: bool,
}

/// The guest-physical regions an attach added (one per memory run, in order) and what they
/// hold. After the enclave detaches (and the bridge detached at the source), the regions are
/// kept while the permit is (`mapped` false): an attach of the same range whose source answers
/// with the same runs takes them again, adding and removing no region (a region's removal
/// drops the whole machine's shadow page tables on PVM, and adding one costs the VMM a
/// mapping). A job that attaches the same data at every step (in-situ analytics) then pays
/// little more than its request. The enclave's job cannot reach kept regions (its kernel
/// unmapped them); a revocation of the permit or its release removes them.
struct BridgedAttachment {
    offset: u64,
    size: u64,
    /// What the source's runs were (`None`: unknown, never taken again).
    runs: Option<Vec<RunIdentity>>,
    frames: Vec<FrameRun>,
    regions: Vec<SharedRegion>,
    mapped: bool,
    /// Where the owner kernel's count of page-table changes reads in the enclave's machine,
    /// once a read-only region of it was added (one of `regions`).
    count_at: Option<u64>,
}

/// An owner's frames for an attach, and (when it publishes one and it stood still) its RAM
/// and its count of page-table changes the frames hold while.
type OwnerAnswer = (SegmentId, Vec<FrameRun>, Option<OwnerCount>);

/// An owner enclave's count of page-table changes: the RAM it lies in, and the value an answer
/// holds while.
struct OwnerCount {
    ram: Arc<dyn FrameSource>,
    value: u64,
}

impl BridgedAttachment {
    /// The attachment for a source's answer (`segment`, `runs`) to an attach of
    /// `[offset, offset + size)`: the kept one if it holds the same runs (taken out of `kept`),
    /// else new regions added to the enclave's machine.
    fn for_answer(
        segment: SegmentId,
        expected: SegmentId,
        offset: u64,
        size: u64,
        runs: &[xemem_host::EnclaveRun],
        kept: &mut Option<BridgedAttachment>,
        regions: &dyn GuestRegions,
    ) -> Result<BridgedAttachment, Error> {
        let total: Option<u64> = runs.iter().try_fold(0u64, |sum, run| {
            sum.checked_add(match run {
                xemem_host::EnclaveRun::Hole { length } | xemem_host::EnclaveRun::Memory { length, .. } => *length,
            })
        });
        if segment != expected || total != Some(size) {
            return Err(Error::Malformed);
        }
        let identities = run_identities(runs);
        let same = |attachment: &mut BridgedAttachment| attachment.offset == offset && attachment.size == size && identities.is_some() && attachment.runs == identities;
        if let Some(again) = kept.take_if(same) {
            return Ok(BridgedAttachment { mapped: true, ..again });
        }
        let (frames, added) = runs_into_regions(runs, regions)?;
        Ok(BridgedAttachment { offset, size, runs: identities, frames, regions: added, mapped: true, count_at: None })
    }

    /// The word that says how long the answer holds, for an enclave that may use it again
    /// without asking (`MappingWord`): the owner's count, made readable in the enclave's
    /// machine by a read-only region of the block holding it (added once per attachment).
    /// `None` without a count, or when the region cannot be added (the answer is then simply
    /// not used again).
    fn valid_while(&mut self, count: Option<OwnerCount>, regions: &dyn GuestRegions) -> Option<MappingWord> {
        let OwnerCount { ram, value } = count?;
        let address = match self.count_at {
            Some(address) => address,
            None => {
                let block = ram.mapping_changes_block()?;
                let region = regions.add(&block.file, block.offset, block.len, RegionAccess::ReadOnly).ok()?;
                self.regions.push(region);
                let address = region.gpa.checked_add(block.word)?;
                self.count_at = Some(address);
                address
            }
        };
        Some(MappingWord { address, value })
    }
}

/// A source's run, as a kept attachment is compared with a new answer: the same file (device
/// and inode) at the same place, or a hole of the same length.
#[derive(Debug, PartialEq, Eq)]
enum RunIdentity {
    Hole { length: u64 },
    Memory { device: u64, inode: u64, offset: u64, length: u64 },
}

/// The identities of `runs`, or `None` if a file cannot be looked at.
fn run_identities(runs: &[xemem_host::EnclaveRun]) -> Option<Vec<RunIdentity>> {
    use std::os::unix::fs::MetadataExt;
    runs.iter()
        .map(|run| match run {
            xemem_host::EnclaveRun::Hole { length } => Some(RunIdentity::Hole { length: *length }),
            xemem_host::EnclaveRun::Memory { file, offset, length } => {
                let metadata = File::from(file.try_clone().ok()?).metadata().ok()?;
                Some(RunIdentity::Memory { device: metadata.dev(), inode: metadata.ino(), offset: *offset, length: *length })
            }
        })
        .collect()
}

/// A segment or an enclave that went away: the permits bridged on it are revoked.
#[derive(Clone, Copy, Debug)]
enum Gone {
    Segment(SegmentId),
    Enclave(EnclaveId),
}

/// The enclave side's requests served by the daemon itself: about host processes' segments
/// (from the broker) and about other enclaves' segments (through the daemon's own permits).
#[derive(Default)]
struct Bridge {
    /// By (the holder's enclave and process, the id the enclave knows).
    permits: HashMap<(EnclaveId, u64, AccessId), BridgedPermit>,
    next_permit: u32,
    /// Answers already sent, by (origin, request id): a retry gets the same answer instead of
    /// a second attach (the node retries when the broker is slow).
    answered: HashMap<(EnclaveId, u64), Vec<Vec<u8>>>,
    answer_order: VecDeque<(EnclaveId, u64)>,
    /// Requests being served (a retry of one is dropped: its answer is on its way).
    serving: std::collections::HashSet<(EnclaveId, u64)>,
    /// Revokes sent to the enclave and not yet acknowledged.
    revocations: Vec<Revocation>,
    next_revoke: u64,
    /// The port is gone: a request served meanwhile gives back what it got.
    closed: bool,
}

impl Bridge {
    /// Takes away the permits `which` selects (holder enclave, process, permit). Those with an
    /// attachment get a `Revoke` on `queue`; their regions stay until the enclave acknowledges
    /// (`waiter` counts them).
    fn revoke_where(&mut self, which: impl Fn(EnclaveId, u64, &BridgedPermit) -> bool, queue: &Outbox, waiter: &Arc<Outstanding>) {
        let chosen: Vec<(EnclaveId, u64, AccessId)> = self.permits.iter().filter(|((enclave, process, _), permit)| which(*enclave, *process, permit)).map(|(key, _)| *key).collect();
        for key in chosen {
            // A kept attachment is revoked as a mapped one is (the enclave's acknowledgement
            // finds nothing to unmap): its regions go when it answers.
            let Some(BridgedPermit { attachment: Some(attachment), .. }) = self.permits.remove(&key) else { continue };
            let (enclave, process, access) = key;
            self.send_revoke(enclave, process, access, attachment.regions, queue, waiter);
        }
    }

    /// Sends `enclave` a `Revoke` of `process`'s permit `access` on `queue`; `regions` stay
    /// until it acknowledges (or the deadline passes), and `waiter` counts it until then.
    fn send_revoke(&mut self, enclave: EnclaveId, process: u64, access: AccessId, regions: Vec<SharedRegion>, queue: &Outbox, waiter: &Arc<Outstanding>) {
        self.next_revoke += 1;
        let request = self.next_revoke;
        let Ok(bytes) = Message::new(request, NAME_SERVER_ENCLAVE, enclave, Body::Revoke { process, access }).to_bytes() else { return };
        waiter.add();
        self.revocations.push(Revocation { request, enclave, process, access, regions, deadline: Instant::now() + REVOKE_TIMEOUT, waiter: waiter.clone() });
        queue.send(bytes);
    }
}

/// A `Revoke` the enclave has not acknowledged: the regions stay until it does (its job may
/// still map them), or until the enclave is gone or the deadline passes.
struct Revocation {
    request: u64,
    enclave: EnclaveId,
    process: u64,
    /// The enclave's id for the permit.
    access: AccessId,
    regions: Vec<SharedRegion>,
    deadline: Instant,
    waiter: Arc<Outstanding>,
}

/// How long an enclave may take to acknowledge a revoke before its regions are removed
/// anyway (an enclave that still maps them then faults: it did not answer in time).
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A count of unfinished revocations that one broker call waits for.
#[derive(Default)]
struct Outstanding {
    left: Mutex<usize>,
    changed: Condvar,
}

impl Outstanding {
    fn add(&self) {
        *self.left.lock().unwrap() += 1;
    }
    fn finish(&self) {
        *self.left.lock().unwrap() -= 1;
        self.changed.notify_all();
    }
    /// Waits until none is left or `timeout` passed.
    fn wait(&self, timeout: Duration) {
        let left = self.left.lock().unwrap();
        let _ = self.changed.wait_timeout_while(left, timeout, |left| *left > 0);
    }
}

impl Revocation {
    /// The enclave let go (or cannot touch the regions any more): they go, and the waiting
    /// broker call hears of it.
    fn finish(self, regions: Option<&dyn GuestRegions>) {
        if let Some(machine) = regions {
            for region in &self.regions {
                let _ = machine.remove(region.slot);
            }
        }
        self.waiter.finish();
    }
}

/// Turns the owner's memfd runs into new guest-physical regions of the attaching enclave; on
/// any failure the regions added so far are removed again. Every run is checked first: a
/// memory run must be page-aligned in its file and a non-empty multiple of pages long, and
/// the region the VMM answers with must be page-aligned.
fn runs_into_regions(runs: &[xemem_host::EnclaveRun], regions: &dyn GuestRegions) -> Result<(Vec<FrameRun>, Vec<SharedRegion>), Error> {
    let page = xemem::PAGE_SIZE;
    if runs.is_empty() || runs.len() > xemem::wire::MAX_RUNS_PER_ATTACH as usize {
        return Err(Error::Invalid);
    }
    let mut frames = Vec::with_capacity(runs.len());
    let mut added: Vec<SharedRegion> = Vec::new();
    let undo = |added: &[SharedRegion]| {
        for region in added {
            let _ = regions.remove(region.slot);
        }
    };
    for run in runs {
        let (length, first) = match run {
            xemem_host::EnclaveRun::Hole { length } => (*length, None),
            xemem_host::EnclaveRun::Memory { file, offset, length } => {
                if offset % page != 0 || length % page != 0 || *length == 0 {
                    undo(&added);
                    return Err(Error::Invalid);
                }
                let file = File::from(match file.try_clone() {
                    Ok(file) => file,
                    Err(_) => {
                        undo(&added);
                        return Err(Error::Exhausted);
                    }
                });
                let region = match regions.add(&file, *offset, *length, RegionAccess::ReadWrite) {
                    Ok(region) => region,
                    Err(_) => {
                        undo(&added);
                        return Err(Error::Exhausted);
                    }
                };
                added.push(region);
                if region.gpa % page != 0 {
                    undo(&added);
                    return Err(Error::Invalid);
                }
                (*length, Some(region.gpa / page))
            }
        };
        let run = FrameRun { first, frames: length / page };
        if length % page != 0 || !run.valid() {
            undo(&added);
            return Err(Error::Invalid);
        }
        frames.push(run);
    }
    Ok((frames, added))
}

/// What the bridge makes of a message from the enclave side (see [`Bridging::claim`]).
enum Claim {
    /// Not the bridge's: the node handles it.
    Node,
    /// Already answered (a retry): the same answers again.
    Answers(Vec<Vec<u8>>),
    /// A retry of a request still being served: its answer is on its way.
    Busy,
    /// The bridge serves it.
    Serve,
}

/// The parts of a port the bridge needs, which a thread serving a daemon link's bridged
/// request holds on to (see [`XememPort::from_enclave`]).
#[derive(Clone)]
struct Bridging {
    links: Arc<XememLinks>,
    link: LinkId,
    bridge: Arc<Mutex<Bridge>>,
    peer: bool,
}

/// How many bridged requests of one daemon link may be served at once; beyond that a request
/// is answered `Failed(Exhausted)` (a peer cannot make this daemon start threads at will).
const MAX_BRIDGING_PER_LINK: usize = 32;

impl Bridging {
    /// Whether `message` is an enclave process's request the daemon answers itself: about a
    /// host process's segment (those live in the broker, not in the node's name server) or
    /// about another enclave's segment (whose memory the daemon maps into this enclave's
    /// machine). Never blocks: serving is [`Bridging::serve`]'s.
    fn claim(&self, message: &Message) -> Claim {
        let broker = self.links.broker.get();
        let header = message.header;
        if header.destination != NAME_SERVER_ENCLAVE || header.origin == NAME_SERVER_ENCLAVE {
            return Claim::Node;
        }
        let origin = header.origin;
        // Only an enclave this link leads to may speak for its processes; `behind_here` is
        // whether the owner of a segment lies behind this link too.
        let behind_here = {
            let links = self.links.links.lock().unwrap();
            if links.node.route(origin) != Some(self.link) {
                return Claim::Node;
            }
            match &message.body {
                Body::Get { segment, .. } => links.node.route(segment.enclave()) == Some(self.link),
                _ => false,
            }
        };
        let mut bridge = self.bridge.lock().unwrap();
        let ours = |bridge: &Bridge, process: u64, access: AccessId| bridge.permits.contains_key(&(origin, process, access));
        let is_ours = match &message.body {
            // Host processes' segments are the broker's; a sub-manager has no broker here, and
            // takes a permit at the name server upstream instead (below).
            Body::Get { segment, .. } if segment.enclave() == NAME_SERVER_ENCLAVE && broker.is_some() => true,
            // Another enclave's segment; an enclave's own goes to the name server (its kernel
            // maps its own pages). A daemon's request for a segment whose owner lies behind
            // that daemon's own link goes to the name server too: the owner answers the
            // requester below directly, and the memory need not come up and go down again.
            Body::Get { segment, .. } => segment.enclave() != origin && !(self.peer && behind_here),
            Body::Attach { process, access, .. }
            | Body::Detach { process, access }
            | Body::Release { process, access }
            | Body::Signal { process, access } => ours(&bridge, *process, *access),
            _ => false,
        };
        if !is_ours {
            return Claim::Node;
        }
        if let Some(answers) = bridge.answered.get(&(origin, header.request)) {
            return Claim::Answers(answers.clone());
        }
        if !bridge.serving.insert((origin, header.request)) {
            return Claim::Busy;
        }
        Claim::Serve
    }

    /// Serves a claimed request and returns the encoded answers, which are kept for the
    /// requester's retries. The bridge's lock is never held while this waits (for the broker,
    /// an owner's library or the node), so the link's pump and other requests go on meanwhile.
    fn serve(&self, message: &Message, regions: &dyn GuestRegions) -> Vec<Vec<u8>> {
        let header = message.header;
        let origin = header.origin;
        let bodies = self.serve_bridged(origin, &message.body, regions).unwrap_or_else(|error| vec![Body::Failed { error }]);
        self.answered(origin, header.request, bodies)
    }

    /// Encodes the answers to `origin`'s `request` and keeps them for its retries.
    fn answered(&self, origin: EnclaveId, request: u64, bodies: Vec<Body>) -> Vec<Vec<u8>> {
        let answers: Vec<Vec<u8>> = bodies
            .into_iter()
            .filter_map(|body| {
                let mut bytes = Vec::new();
                Message::new(request, NAME_SERVER_ENCLAVE, origin, body).encode(&mut bytes).ok().map(|_| bytes)
            })
            .collect();
        let mut bridge = self.bridge.lock().unwrap();
        bridge.serving.remove(&(origin, request));
        if bridge.answer_order.len() >= BRIDGE_ANSWERS_KEPT {
            if let Some(old) = bridge.answer_order.pop_front() {
                bridge.answered.remove(&old);
            }
        }
        bridge.answer_order.push_back((origin, request));
        bridge.answered.insert((origin, request), answers.clone());
        answers
    }

    /// Drops the answer kept for `origin`'s `request`.
    fn forget_answer(&self, origin: EnclaveId, request: u64) {
        let mut bridge = self.bridge.lock().unwrap();
        bridge.answered.remove(&(origin, request));
        bridge.answer_order.retain(|kept| *kept != (origin, request));
    }

    /// Queues answers on this link (its pump sends them).
    fn send(&self, answers: Vec<Vec<u8>>) {
        if let Some(queue) = self.links.links.lock().unwrap().outgoing.get(&self.link) {
            for answer in answers {
                queue.send(answer);
            }
        }
    }

    fn serve_bridged(&self, origin: EnclaveId, body: &Body, regions: &dyn GuestRegions) -> Result<Vec<Body>, Error> {
        let broker = self.links.broker.get();
        let caller = |process: u64| Principal { enclave: origin, process };
        let links = &self.links;
        match body {
            Body::Get { process, segment, access, .. } => {
                let others = Credentials { uid: ENCLAVE_PROCESS_CREDENTIALS_UID, groups: vec![ENCLAVE_PROCESS_CREDENTIALS_UID] };
                let (source, size) = if segment.enclave() == NAME_SERVER_ENCLAVE && broker.is_some() {
                    let (broker_access, size) = broker.ok_or(Error::NotFound)?.get_for_enclave(caller(*process), &others, *segment, *access)?;
                    (Source::Host { broker_access }, size)
                } else {
                    let proxy = links.next_proxy.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match links.call(Request::Get { process: proxy, segment: *segment, access: *access, credentials: others })? {
                        Reply::Granted { access, size } => (Source::Enclave { access, proxy }, size),
                        _ => return Err(Error::Malformed),
                    }
                };
                let mut bridge = self.bridge.lock().unwrap();
                if bridge.closed {
                    drop(bridge);
                    links.release_at_source(caller(*process), source);
                    return Err(Error::Unreachable);
                }
                let permit = loop {
                    let local = bridge.next_permit.max(FIRST_HOST_PERMIT);
                    bridge.next_permit = if local >= xemem::ids::MAX_LOCAL_ID { FIRST_HOST_PERMIT } else { local + 1 };
                    let candidate = AccessId::new(NAME_SERVER_ENCLAVE, local).ok_or(Error::Exhausted)?;
                    if !bridge.permits.contains_key(&(origin, *process, candidate)) {
                        break candidate;
                    }
                };
                bridge.permits.insert((origin, *process, permit), BridgedPermit { source, segment: *segment, attachment: None, attaching: false });
                Ok(vec![Body::Granted { access: permit, size }])
            }
            Body::Attach { process, access, offset, size } => {
                let key = (origin, *process, *access);
                let (source, expected, mut kept) = {
                    let mut bridge = self.bridge.lock().unwrap();
                    let permit = bridge.permits.get_mut(&key).ok_or(Error::NotFound)?;
                    // One attachment per permit at a time: a detach names only the permit, so a
                    // second one could not be told apart (a second permit gives a second one).
                    if permit.attachment.as_ref().is_some_and(|attachment| attachment.mapped) || permit.attaching {
                        return Err(Error::Exhausted);
                    }
                    if offset % xemem::PAGE_SIZE != 0 || *size == 0 || size % xemem::PAGE_SIZE != 0 {
                        return Err(Error::Invalid);
                    }
                    permit.attaching = true;
                    (permit.source, permit.segment, permit.attachment.take())
                };
                let attached = match source {
                    Source::Host { broker_access } => broker
                        .ok_or(Error::NotFound)
                        .and_then(|broker| broker.attach_for_enclave(caller(*process), broker_access, *offset, *size))
                        .map(|(segment, runs)| (segment, runs, None)),
                    Source::Enclave { access, proxy } => links.attach_enclave_memory(proxy, access, *offset, *size),
                };
                let mapped = attached.and_then(|(segment, runs, count)| {
                    let attachment = BridgedAttachment::for_answer(segment, expected, *offset, *size, &runs, &mut kept, regions);
                    let parts = attachment.and_then(|mut attachment| {
                        let valid_while = attachment.valid_while(count, regions);
                        match xemem::wire::attached_parts(segment, *size, &attachment.frames, valid_while) {
                            Ok(parts) => Ok((parts, attachment)),
                            Err(error) => {
                                remove_regions(regions, &attachment.regions);
                                Err(error)
                            }
                        }
                    });
                    // The source counted this attach: undone when nothing holds it.
                    parts.inspect_err(|_| links.detach_at_source(caller(*process), source))
                });
                // A kept attachment not taken again: its regions go.
                if let Some(unused) = kept {
                    remove_regions(regions, &unused.regions);
                }
                let mut bridge = self.bridge.lock().unwrap();
                let closed = bridge.closed;
                let permit = bridge.permits.get_mut(&key).filter(|_| !closed);
                match (mapped, permit) {
                    (Ok((parts, attachment)), Some(permit)) => {
                        permit.attaching = false;
                        permit.attachment = Some(attachment);
                        links.bridged_attaches.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                        Ok(parts)
                    }
                    (Ok((_, attachment)), None) => {
                        // Released, revoked or gone while the owner answered: nothing keeps it.
                        drop(bridge);
                        remove_regions(regions, &attachment.regions);
                        links.detach_at_source(caller(*process), source);
                        Err(Error::NotFound)
                    }
                    (Err(error), permit) => {
                        if let Some(permit) = permit {
                            permit.attaching = false;
                        }
                        Err(error)
                    }
                }
            }
            // The enclave unmaps the attachment before it detaches or releases (the guest must
            // not keep a mapping of a region that is gone).
            // Its regions are kept while the permit is (see `BridgedAttachment`).
            Body::Detach { process, access } => {
                let source = {
                    let mut bridge = self.bridge.lock().unwrap();
                    let permit = bridge.permits.get_mut(&(origin, *process, *access)).ok_or(Error::NotFound)?;
                    match permit.attachment.as_mut().filter(|attachment| attachment.mapped) {
                        Some(attachment) => {
                            attachment.mapped = false;
                            Some(permit.source)
                        }
                        None => None,
                    }
                };
                if let Some(source) = source {
                    links.detach_at_source(caller(*process), source);
                }
                Ok(vec![Body::Done])
            }
            Body::Release { process, access } => {
                let permit = self.bridge.lock().unwrap().permits.remove(&(origin, *process, *access)).ok_or(Error::NotFound)?;
                if let Some(attachment) = permit.attachment {
                    remove_regions(regions, &attachment.regions);
                    if attachment.mapped {
                        links.detach_at_source(caller(*process), permit.source);
                    }
                }
                // The owner may have removed the segment already: the permit is gone then too.
                links.release_at_source(caller(*process), permit.source);
                Ok(vec![Body::Done])
            }
            // XEMEM's signal through a bridged permit: the host owner's library, or (through
            // the proxy permit) the owner enclave's kernel, gets the notification.
            Body::Signal { process, access } => {
                let source = self.bridge.lock().unwrap().permits.get(&(origin, *process, *access)).ok_or(Error::NotFound)?.source;
                match source {
                    Source::Host { broker_access } => broker.ok_or(Error::NotFound)?.signal_for_enclave(caller(*process), broker_access)?,
                    Source::Enclave { access, proxy } => {
                        links.call(Request::Signal { process: proxy, access })?;
                    }
                }
                Ok(vec![Body::Done])
            }
            _ => Err(Error::Invalid),
        }
    }
}

fn remove_regions(regions: &dyn GuestRegions, added: &[SharedRegion]) {
    for region in added {
        let _ = regions.remove(region.slot);
    }
}

/// A port's way to its node from another thread (a daemon link's remove, which waits for
/// revocations first).
struct Remover {
    links: Arc<XememLinks>,
    link: LinkId,
}

impl Remover {
    /// Revokes every attachment of `segments` (which are going) outside their owner and
    /// waits: host processes' libraries remap theirs (SIGBUS from then on), other enclaves
    /// unmap theirs and acknowledge. The links' lock is not held while waiting.
    fn revoke_segments(&self, segments: &[SegmentId]) {
        let holders = self.links.daemon_holders(segments);
        self.revoke_segments_held(segments, &holders);
    }

    /// [`Remover::revoke_segments`], with the daemons' permits on them already taken (a job's
    /// end removes its segments first).
    fn revoke_segments_held(&self, segments: &[SegmentId], holders: &[(AccessId, Principal)]) {
        if let Some(broker) = self.links.attachers.get() {
            broker.revoke_remote(|segment| segments.contains(&segment));
        }
        self.links.revoke_segments(segments);
        self.links.revoke_daemon_holders(holders);
    }

    /// The message goes to the node; if it removed `removing` (the name server checked the
    /// owner), other links' permits bridged on it go.
    fn receive(&self, bytes: &[u8], removing: Option<SegmentId>) {
        let mut links = self.links.links.lock().unwrap();
        let now = self.links.now();
        links.node.tick(now, &mut NoHostMemory);
        links.node.receive(self.link, bytes, &mut NoHostMemory);
        if let Some(segment) = removing.filter(|segment| links.node.name_server().is_some_and(|ns| ns.segment(*segment).is_none())) {
            XememLinks::announce(&links, Gone::Segment(segment));
        }
        self.links.deliver(&mut links);
    }
}

impl XememPort {
    pub fn link(&self) -> LinkId {
        self.link
    }

    /// One message the enclave sent (not yet decoded: the node validates it). Requests about
    /// host processes' segments are served by the broker, with `regions` (the enclave's
    /// machine) adding the owner's memory as guest-physical regions.
    pub fn from_enclave(&self, bytes: &[u8], regions: &dyn GuestRegions) {
        if let Ok(Message { header, body: Body::Revoked { process, access } }) = Message::decode(bytes) {
            // An acknowledgement of a revoke this link sent; from a daemon below, it may also
            // answer one the name server's daemon sent to a daemon further down: on it goes.
            if self.revoked(header.request, header.origin, process, access, regions) || !self.peer {
                return;
            }
        }
        let mut removing = None;
        let mut vanishing = None;
        if let Ok(message) = Message::decode(bytes) {
            if !self.may_pass(&message) {
                return;
            }
            // The way to the name server is up, never through an enclave or a daemon below
            // (which may still answer to an id this daemon had before it rejoined).
            if message.body == Body::PongNameServer && !self.upstream {
                return;
            }
            // A daemon below tells the name server an enclave behind it is gone (the node
            // believes it only from the link its route to that enclave uses).
            if let Body::EnclaveGone { enclave } = message.body {
                vanishing = Some(enclave).filter(|enclave| self.links.links.lock().unwrap().node.route(*enclave) == Some(self.link));
            }
            let bridging = self.bridging();
            match bridging.claim(&message) {
                Claim::Node => {}
                Claim::Busy => return,
                Claim::Answers(answers) => return bridging.send(answers),
                // A daemon link's bridged request may wait for answers that come back on this
                // very link (or on a link whose pump waits for this one): not on its pump.
                Claim::Serve => match &self.peer_regions {
                    Some(regions) => {
                        let (regions, workers) = (regions.clone(), self.workers.clone());
                        if workers.fetch_add(1, std::sync::atomic::Ordering::AcqRel) >= MAX_BRIDGING_PER_LINK {
                            workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                            // Not kept for retries: a retry (the caller's, as for any
                            // failure) may find a free worker.
                            let answers = bridging.answered(message.header.origin, message.header.request, vec![Body::Failed { error: Error::Exhausted }]);
                            bridging.forget_answer(message.header.origin, message.header.request);
                            return bridging.send(answers);
                        }
                        let spawned = std::thread::Builder::new().name("xemem-bridge".into()).spawn(move || {
                            let answers = bridging.serve(&message, &*regions);
                            bridging.send(answers);
                            workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                        });
                        if spawned.is_err() {
                            self.workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                        }
                        return;
                    }
                    None => return bridging.send(bridging.serve(&message, regions)),
                },
            }
            if let Body::Remove { process, segment } = message.body {
                removing = Some(segment);
                let owner = Principal { enclave: message.header.origin, process };
                let owned = self.links.links.lock().unwrap().node.name_server().and_then(|ns| ns.segment(segment)).is_some_and(|s| s.owner == owner);
                if owned && self.peer {
                    // The revoke waits for holders' acknowledgements, which may come back on
                    // this link: the remove goes on once they came, off this link's pump (on
                    // one of the threads that serve the link's bridged requests; when all are
                    // busy, on the pump after all, where acknowledgements that come back on
                    // this link wait until the deadline).
                    let workers = self.workers.clone();
                    if workers.fetch_add(1, std::sync::atomic::Ordering::AcqRel) >= MAX_BRIDGING_PER_LINK {
                        workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                        self.revoke_segments(&[segment]);
                        return self.remover().receive(bytes, removing);
                    }
                    let (port, bytes) = (self.remover(), bytes.to_vec());
                    let spawned = std::thread::Builder::new().name("xemem-remove".into()).spawn(move || {
                        port.revoke_segments(&[segment]);
                        port.receive(&bytes, Some(segment));
                        workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    });
                    if spawned.is_err() {
                        self.workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    return;
                }
                if owned {
                    // XPMEM: once the remove returns, attachments fault. They go first.
                    self.revoke_segments(&[segment]);
                }
            }
        }
        self.remover().receive(bytes, removing);
        if let Some(enclave) = vanishing.filter(|enclave| self.links.links.lock().unwrap().node.route(*enclave).is_none()) {
            self.links.enclave_went_away(enclave);
        }
    }

    fn bridging(&self) -> Bridging {
        Bridging { links: self.links.clone(), link: self.link, bridge: self.bridge.clone(), peer: self.peer }
    }

    fn remover(&self) -> Remover {
        Remover { links: self.links.clone(), link: self.link }
    }

    /// Whether a message from this enclave may reach the node: it speaks only for enclaves
    /// behind this link (origin 0 is discovery, before an id), and its frame runs are its
    /// own guest-physical addresses, meaningless in any other machine, so they go only to the
    /// name server or on to a daemon link, which sends them as ranges of its RAM memfd (other
    /// enclaves get its memory through the bridge, as regions).
    fn may_pass(&self, message: &Message) -> bool {
        let origin = message.header.origin;
        let links = self.links.links.lock().unwrap();
        // Enclaves we have no route to lie towards the name server (for a sub-manager).
        if origin != 0 && links.node.route(origin).or(links.node.link_towards_name_server()) != Some(self.link) {
            return false;
        }
        // A peer daemon's frames were renumbered into this daemon's own frame space on arrival
        // (`xemem_peer`): they may complete this node's own requests, or go on to another
        // daemon (as files again: a sub-manager's daemon below answering the name server
        // above), never to an enclave.
        let destination = message.header.destination;
        let frames_for = if self.peer { links.node.id().unwrap_or(NAME_SERVER_ENCLAVE) } else { NAME_SERVER_ENCLAVE };
        let next = links.node.route(destination).or(links.node.link_towards_name_server());
        // Frames leave this daemon only as files (`xemem_peer` names an enclave's frames as
        // ranges of its RAM memfd, checked against its RAM), so an enclave's answer may go on
        // to a daemon too: a requester whose permit the name server granted directly, because
        // the owner lies behind the same daemon link as the requester (see `Bridging::claim`).
        let onward_to_a_daemon = next != Some(self.link) && next.and_then(|link| links.ram.get(&link)).is_some_and(|frames| frames.is_peer());
        !matches!(message.body, Body::Attached { .. }) || destination == frames_for || onward_to_a_daemon
    }

    /// The enclave's job ended: the segments its processes made go now, and every attachment
    /// of them elsewhere (host processes, other enclaves) is revoked before this returns (or
    /// [`REVOKE_TIMEOUT`] passes), so a job launched next cannot be seen through them. The
    /// kernel's own removes, sent later, then find nothing to remove.
    pub fn job_ended(&self) {
        let owned: Vec<SegmentId> = {
            let links = self.links.links.lock().unwrap();
            let behind = links.node.enclaves_via(self.link);
            let Some(ns) = links.node.name_server() else { return };
            ns.list(0, usize::MAX).into_iter().filter(|listing| behind.contains(&listing.owner)).map(|listing| listing.segment).collect()
        };
        let holders = self.links.daemon_holders(&owned);
        let segments: Vec<SegmentId> = {
            let mut links = self.links.links.lock().unwrap();
            let behind = links.node.enclaves_via(self.link);
            let Some(ns) = links.node.name_server_mut() else { return };
            ns.remove_owned(|owner| behind.contains(&owner.enclave)).into_iter().map(|segment| segment.id).collect()
        };
        if segments.is_empty() {
            return;
        }
        self.remover().revoke_segments_held(&segments, &holders);
        // As after a remove: the ports drop the permits left on them (those never attached).
        let links = self.links.links.lock().unwrap();
        for segment in segments {
            XememLinks::announce(&links, Gone::Segment(segment));
        }
    }

    /// Revokes every attachment of `segments` (which are going) outside this enclave and
    /// waits: host processes' libraries remap theirs (SIGBUS from then on), other enclaves
    /// unmap theirs and acknowledge. The links' lock is not held while waiting.
    fn revoke_segments(&self, segments: &[SegmentId]) {
        self.remover().revoke_segments(segments);
    }

    /// Segments or enclaves went away: the permits bridged on them are revoked (nobody waits
    /// for these acknowledgements; the regions go when they come).
    fn revoke_gone(&self, gone: &[Gone]) {
        let Some(queue) = self.links.links.lock().unwrap().outgoing.get(&self.link).cloned() else { return };
        let on_gone = |_: EnclaveId, _: u64, permit: &BridgedPermit| {
            matches!(permit.source, Source::Enclave { .. })
                && gone.iter().any(|gone| match gone {
                    Gone::Segment(segment) => permit.segment == *segment,
                    Gone::Enclave(enclave) => permit.segment.enclave() == *enclave,
                })
        };
        let mut bridge = self.bridge.lock().unwrap();
        bridge.revoke_where(on_gone, &queue, &Arc::new(Outstanding::default()));
        // Those without an attachment just go: their segment is gone at the name server too.
        bridge.permits.retain(|(enclave, process, _), permit| !on_gone(*enclave, *process, permit));
    }

    /// The enclave acknowledged a revoke: nothing maps the regions now. An acknowledgement
    /// that matches no revoke sent on this link (a forgery, a repeat) changes nothing.
    fn revoked(&self, request: u64, origin: EnclaveId, process: u64, access: AccessId, regions: &dyn GuestRegions) -> bool {
        let mut bridge = self.bridge.lock().unwrap();
        let matching = bridge.revocations.iter().position(|r| r.request == request && r.enclave == origin && r.process == process && r.access == access);
        if let Some(index) = matching {
            bridge.revocations.swap_remove(index).finish(Some(regions));
        }
        matching.is_some()
    }

    /// Every pump round: time passes for the node, and revokes past their deadline end (the
    /// regions go whether or not the enclave let go).
    pub fn tick(&self, regions: &dyn GuestRegions) {
        let gone: Vec<Gone> = self.gone.try_iter().collect();
        if !gone.is_empty() {
            self.revoke_gone(&gone);
        }
        {
            let mut bridge = self.bridge.lock().unwrap();
            let now = Instant::now();
            let (late, waiting): (Vec<Revocation>, Vec<Revocation>) = bridge.revocations.drain(..).partition(|r| r.deadline <= now);
            bridge.revocations = waiting;
            for revocation in late {
                revocation.finish(Some(regions));
            }
        }
        let mut links = self.links.links.lock().unwrap();
        let now = self.links.now();
        links.node.tick(now, &mut NoHostMemory);
        self.links.deliver(&mut links);
    }

    /// Messages for this enclave, each to be sent as one `HostMessage::Xemem`.
    pub fn to_enclave(&self) -> Vec<Vec<u8>> {
        self.outgoing.try_iter().collect()
    }
}

impl Drop for XememPort {
    fn drop(&mut self) {
        // The enclave's machine is going: its regions go with it; its bridged permits are
        // given back, and the broker forgets the enclave.
        let bridge = {
            let mut bridge = self.bridge.lock().unwrap();
            let taken = std::mem::take(&mut *bridge);
            bridge.closed = true;
            taken
        };
        // The machine is gone: nothing can touch the regions any more.
        for revocation in bridge.revocations {
            revocation.finish(None);
        }
        let mut enclaves: Vec<EnclaveId> = Vec::new();
        for ((enclave, process, _), permit) in bridge.permits {
            let caller = Principal { enclave, process };
            if permit.attachment.is_some_and(|attachment| attachment.mapped) {
                self.links.detach_at_source(caller, permit.source);
            }
            self.links.release_at_source(caller, permit.source);
            enclaves.push(enclave);
        }
        enclaves.sort_unstable();
        enclaves.dedup();
        if let Some(broker) = self.links.broker.get() {
            for enclave in enclaves {
                broker.forget_enclave(enclave);
            }
        }
        let mut links = self.links.links.lock().unwrap();
        links.outgoing.remove(&self.link);
        links.bridges.remove(&self.link);
        links.gone.remove(&self.link);
        links.ram.remove(&self.link);
        // The name server forgets the enclaves behind this link; other enclaves' attachments
        // of their segments are revoked.
        let behind = links.node.enclaves_via(self.link);
        let upstream = links.node.name_server().is_none() && links.node.link_towards_name_server() == Some(self.link);
        links.node.link_down(self.link, &mut NoHostMemory);
        for enclave in &behind {
            XememLinks::announce(&links, Gone::Enclave(*enclave));
        }
        if upstream {
            // The name server forgot this daemon (it restarted, or a daemon between died):
            // this node rejoins with a new id when a link to a name server is up again.
            links.node.rejoin();
            self.links.upstream_losses.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.links.deliver(&mut links);
        drop(links);
        // Host processes attached to their segments map the enclaves' RAM, which outlives the
        // machine as long as they do: their libraries remap the attachments (SIGBUS).
        if let Some(broker) = self.links.attachers.get() {
            broker.revoke_remote(|segment| behind.contains(&segment.enclave()));
        }
        if upstream {
            // Every segment made and permit taken through it is gone with it: enclaves here
            // let go of what they attached through the daemon's proxy permits, and host
            // processes of what they attached (their own segments included). Daemons below
            // are unlinked by their links (`xemem_peer`) and link again.
            self.links.revoke_bridged(|permit| matches!(permit.source, Source::Enclave { .. }));
            if let Some(broker) = self.links.attachers.get() {
                broker.upstream_lost();
            }
            eprintln!("clowderd: xemem: the name server is out of reach: its segments and permits here are gone");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::os::fd::OwnedFd;
    use xemem_host::EnclaveRun;

    /// Enclave RAM on 2 MiB pages: frame n is at byte n * 4 KiB of one file.
    struct HugeRam(File);

    impl FrameSource for HugeRam {
        fn file_range(&self, gpa: u64, _len: u64) -> Result<(File, u64), Error> {
            Ok((self.0.try_clone().map_err(|_| Error::Exhausted)?, gpa))
        }
        fn mappable_unit(&self) -> u64 {
            2 << 20
        }
    }

    #[test]
    fn runs_of_hugepage_ram_must_be_whole_pages() {
        let ram = HugeRam(crate::sys::memfd("huge-ram-test").unwrap());
        let huge = 512; // 4 KiB frames per 2 MiB page
        let whole = [FrameRun { first: Some(2 * huge), frames: 2 * huge }, FrameRun { first: None, frames: 3 }];
        let runs = file_runs(&ram, &whole).unwrap();
        assert!(matches!(runs[0], FileRun::Memory { offset, len, .. } if offset == 4 << 20 && len == 4 << 20));
        for part in [FrameRun { first: Some(2 * huge + 1), frames: huge }, FrameRun { first: Some(2 * huge), frames: huge + 1 }] {
            assert_eq!(file_runs(&ram, &[part]).err(), Some(Error::WholePagesOnly), "{part:?}: a process can map only whole 2 MiB pages");
        }
    }

    /// A machine that places regions one after another from 4 GiB (or at `gpa_skew` past it,
    /// to play a VMM that answers with a misaligned address) and remembers what is live.
    #[derive(Default)]
    struct FakeRegions {
        live: RefCell<Vec<u32>>,
        next: RefCell<u32>,
        gpa_skew: u64,
    }

    impl GuestRegions for FakeRegions {
        fn add(&self, _file: &File, _offset: u64, len: u64, _access: RegionAccess) -> Result<SharedRegion, String> {
            let slot = *self.next.borrow();
            *self.next.borrow_mut() += 1;
            self.live.borrow_mut().push(slot);
            Ok(SharedRegion { slot, gpa: (4 << 30) + slot as u64 * len + self.gpa_skew })
        }
        fn remove(&self, slot: u32) -> Result<(), String> {
            self.live.borrow_mut().retain(|live| *live != slot);
            Ok(())
        }
    }

    fn memfd() -> OwnedFd {
        crate::sys::memfd("xemem-bridge-test").unwrap().into()
    }

    fn memory(offset: u64, length: u64) -> EnclaveRun {
        EnclaveRun::Memory { file: memfd(), offset, length }
    }

    #[test]
    fn owner_runs_become_regions_frame_for_frame() {
        let regions = FakeRegions::default();
        let runs = [memory(0, 2 * 4096), EnclaveRun::Hole { length: 4096 }, memory(8192, 4096)];
        let (frames, added) = runs_into_regions(&runs, &regions).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0], FrameRun { first: Some(added[0].gpa / 4096), frames: 2 });
        assert_eq!(frames[1], FrameRun { first: None, frames: 1 });
        assert_eq!(frames[2], FrameRun { first: Some(added[1].gpa / 4096), frames: 1 });
        assert_eq!(regions.live.borrow().len(), 2);
    }

    #[test]
    fn malformed_runs_are_refused_and_leave_no_region() {
        for runs in [
            vec![memory(0, 4096), memory(100, 4096)],        // misaligned offset, after a good run
            vec![memory(0, 4096), memory(4096, 4096 + 1)],   // length not a page multiple
            vec![memory(0, 4096), memory(4096, 0)],          // empty run
            vec![EnclaveRun::Hole { length: 10 }],           // hole not a page multiple
            vec![],                                          // nothing at all
        ] {
            let regions = FakeRegions::default();
            assert_eq!(runs_into_regions(&runs, &regions).err(), Some(Error::Invalid));
            assert!(regions.live.borrow().is_empty(), "a region stayed after a refused attach");
        }
        // Too many runs for one attach.
        let many: Vec<EnclaveRun> = (0..=xemem::wire::MAX_RUNS_PER_ATTACH).map(|_| EnclaveRun::Hole { length: 4096 }).collect();
        assert_eq!(runs_into_regions(&many, &FakeRegions::default()).err(), Some(Error::Invalid));
        // A VMM answering with a misaligned guest-physical address.
        let skewed = FakeRegions { gpa_skew: 8, ..FakeRegions::default() };
        assert_eq!(runs_into_regions(&[memory(0, 4096)], &skewed).err(), Some(Error::Invalid));
        assert!(skewed.live.borrow().is_empty());
    }

    /// A port whose enclave has been given an id by the name server, as a kernel would get one.
    fn linked_port(links: &Arc<XememLinks>, token: u64) -> (XememPort, EnclaveId) {
        let (port, enclave, _) = linked_port_and_wake(links, token);
        (port, enclave)
    }

    /// [`linked_port`], with the eventfd its pump would sleep on.
    fn linked_port_and_wake(links: &Arc<XememLinks>, token: u64) -> (XememPort, EnclaveId, File) {
        let file = crate::sys::memfd("xemem-links-test").unwrap();
        file.set_len(1 << 20).unwrap();
        let ram = GuestRam::map(&file, vec![crate::guest_ram::RamRange { gpa: 0, size: 1 << 20, file_offset: 0 }], (0xf0000, 4096)).unwrap();
        let wake = crate::sys::eventfd().unwrap();
        let port = links.join(Arc::new(ram), wake.try_clone().unwrap()).unwrap();
        let regions = FakeRegions::default();
        port.from_enclave(&Message::new(0, 0, 0, Body::EnclaveIdRequest { token }).to_bytes().unwrap(), &regions);
        let answers: Vec<Message> = port.to_enclave().iter().map(|bytes| Message::decode(bytes).unwrap()).collect();
        let enclave = answers
            .iter()
            .find_map(|m| match m.body {
                Body::EnclaveIdResponse { token: t, enclave } if t == token => Some(enclave),
                _ => None,
            })
            .expect("an enclave id");
        (port, enclave, wake)
    }

    fn lookup_from(origin: EnclaveId) -> Vec<u8> {
        Message::new(5, origin, NAME_SERVER_ENCLAVE, Body::Lookup { name: Name::new(b"nothing-here").unwrap() }).to_bytes().unwrap()
    }

    #[test]
    fn an_enclave_speaks_only_for_itself_and_its_frames_go_only_to_the_name_server() {
        let links = XememLinks::new();
        let (a, a_id) = linked_port(&links, 1);
        let (b, b_id) = linked_port(&links, 2);
        let regions = FakeRegions::default();
        // Its own request is answered (the name is unknown: NotFound).
        a.from_enclave(&lookup_from(a_id), &regions);
        let answers = a.to_enclave();
        assert_eq!(answers.len(), 1);
        assert_eq!(Message::decode(&answers[0]).unwrap().body, Body::Failed { error: Error::NotFound });
        // The same request claiming to come from b, through a's link: dropped.
        a.from_enclave(&lookup_from(b_id), &regions);
        assert!(a.to_enclave().is_empty() && b.to_enclave().is_empty());
        // Frame runs from a addressed to b: dropped, never forwarded.
        let runs = vec![FrameRun { first: Some(16), frames: 1 }];
        let attached = Message::new(7, a_id, b_id, Body::Attached { segment: SegmentId::new(a_id, 1).unwrap(), size: 4096, first_run: 0, total_runs: 1, runs, valid_while: None });
        a.from_enclave(&attached.to_bytes().unwrap(), &regions);
        assert!(b.to_enclave().is_empty(), "b received a's frames");
        // An acknowledgement of a revoke nobody sent changes nothing.
        let access = AccessId::new(NAME_SERVER_ENCLAVE, FIRST_HOST_PERMIT).unwrap();
        a.from_enclave(&Message::new(99, a_id, NAME_SERVER_ENCLAVE, Body::Revoked { process: 1, access }).to_bytes().unwrap(), &regions);
        assert!(a.to_enclave().is_empty() && regions.live.borrow().is_empty());
    }

    #[test]
    fn a_message_queued_by_a_host_caller_wakes_the_owner_enclaves_pump() {
        use xemem_host::Enclaves;
        let links = XememLinks::new();
        let (owner, owner_id, owner_wake) = linked_port_and_wake(&links, 1);
        let regions = FakeRegions::default();
        let make = Body::Make { process: 1, vaddr: 0x10_0000, size: 4096, uid: 0, gid: 0, mode: 0o600, name: None };
        owner.from_enclave(&Message::new(1, owner_id, NAME_SERVER_ENCLAVE, make).to_bytes().unwrap(), &regions);
        let Body::Made { segment } = Message::decode(&owner.to_enclave().pop().expect("an answer")).unwrap().body else { panic!("no segment made") };
        let root = Credentials { uid: 0, groups: Vec::new() };
        let (access, _) = links.get(7, root, segment, xemem::ACCESS_READ_WRITE).unwrap();
        crate::sys::drain_eventfd(&owner_wake);
        // A host process attaches: the name server's `Serve` for the owner is queued on the
        // caller's thread, and the owner's pump must hear of it at once.
        let caller = {
            let links = links.clone();
            std::thread::spawn(move || links.attach(7, access, 0, 4096))
        };
        assert!(crate::sys::wait_readable(std::os::fd::AsRawFd::as_raw_fd(&owner_wake), Duration::from_secs(2)).unwrap(), "the owner's pump was not woken");
        let serve = Message::decode(&owner.to_enclave().pop().expect("a Serve")).unwrap();
        assert!(matches!(serve.body, Body::Serve { .. }));
        let runs = vec![FrameRun { first: Some(16), frames: 1 }];
        let attached = Body::Attached { segment, size: 4096, first_run: 0, total_runs: 1, runs, valid_while: None };
        owner.from_enclave(&Message::new(serve.header.request, owner_id, NAME_SERVER_ENCLAVE, attached).to_bytes().unwrap(), &regions);
        assert_eq!(caller.join().unwrap().map(|runs| runs.len()), Ok(1));
    }
}
