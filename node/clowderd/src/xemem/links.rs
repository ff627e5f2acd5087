//! The daemon's XEMEM node and its links: the shared state, the host-side API (lookup, list,
//! attach of enclave memory, release), and links joining and leaving.

use super::*;

/// How long a host-side request may wait for the enclaves' answers.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How many enclaves can be linked at once (link ids are reused after a link goes down).
pub(super) const MAX_LINKS: u32 = 4096;

/// The host's own memory as the node sees it: none yet (host segments are the broker's).
pub(super) struct NoHostMemory;

impl LocalMemory for NoHostMemory {
    fn resolve(&mut self, _process: u64, _vaddr: u64, _size: u64) -> Result<Vec<FrameRun>, Error> {
        Err(Error::NotFound)
    }
    fn notify(&mut self, _process: u64, _segment: SegmentId) {}
    fn revoke(&mut self, _process: u64, _access: AccessId) {}
}

pub(super) struct Links {
    pub(super) node: Node,
    /// Where to put each link's outgoing messages (its pump sends them).
    pub(super) outgoing: HashMap<LinkId, Outbox>,
    /// Each link's bridged permits (shared with its port), for revocation.
    pub(super) bridges: HashMap<LinkId, Arc<Mutex<Bridge>>>,
    /// Each link's notices of segments and enclaves that went away.
    pub(super) gone: HashMap<LinkId, mpsc::Sender<Gone>>,
    /// The memory behind each link's frame numbers: an enclave's RAM, or the files a peer
    /// daemon passed (`peer`). Frame runs from the link are checked against it.
    pub(super) ram: HashMap<LinkId, Arc<dyn FrameSource>>,
    /// Finished requests of host callers, until they collect them.
    pub(super) finished: HashMap<u64, Result<Reply, Error>>,
    /// What owner enclaves answered to this daemon's attaches, for repeating them.
    pub(super) owner_runs: OwnerRuns,
}

pub struct XememLinks {
    pub(super) links: Mutex<Links>,
    /// The host's broker, where host processes' segments live: enclaves' requests about them
    /// go there (set once the daemon has a broker).
    pub(super) broker: std::sync::OnceLock<xemem_host::Broker>,
    /// The daemon's broker, name server's or sub-manager's, for revoking its host processes'
    /// attachments of segments that go ([`XememLinks::set_attachers`]).
    pub(super) attachers: std::sync::OnceLock<xemem_host::Broker>,
    /// Signalled whenever requests finish.
    pub(super) finished: Condvar,
    pub(super) started: Instant,
    /// Process numbers the daemon takes permits under for enclave processes (see [`Source`]).
    pub(super) next_proxy: std::sync::atomic::AtomicU64,
    /// How many times a sub-manager lost its link towards the name server.
    pub(super) upstream_losses: std::sync::atomic::AtomicU64,
    /// Attaches served to enclaves through bridged permits (host processes' or other
    /// enclaves' memory), each a round trip through the enclave's kernel.
    pub(super) bridged_attaches: std::sync::atomic::AtomicU64,
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
    /// finds the name server through a daemon link (`peer`) and gets an id from it.
    pub(super) fn with_node(name_server: bool) -> Self {
        XememLinks {
            // Retries in milliseconds: the enclave's answers come within a ping round.
            links: Mutex::new(Links {
                // A random instance: a restarted daemon's enclave ids, segids and apids are
                // not the ones it handed out before (stale ones are not found).
                node: Node::new(
                    MAX_LINKS,
                    name_server.then(|| NameServer::new(crate::sys::random_instance())),
                    Timing { retry_after: 500, attempts: 5 },
                ),
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

    /// A sub-manager daemon's node: not the name server (see `peer`).
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
    pub(super) fn call(&self, request: Request) -> Result<Reply, Error> {
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
        match file_runs(&*ram, &runs, false) {
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
    pub(super) fn owner_ram(&self, segment: SegmentId) -> Option<Arc<dyn FrameSource>> {
        self.frame_source(segment.enclave())
    }
}

impl XememLinks {
    pub(super) fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A new enclave's link; `None` when every link id is taken. `ram` is the enclave's RAM;
    /// `wake` an eventfd the enclave's pump sleeps on, signalled whenever a message for the
    /// enclave is queued from another thread. Its bridged requests are served on the pump,
    /// with the regions it passes.
    pub fn join(self: &Arc<Self>, ram: Arc<GuestRam>, wake: File) -> Option<XememPort> {
        self.join_link(ram, wake, false, None)
    }

    /// An LWK enclave's link, as [`XememLinks::join`], whose bridged requests are served off
    /// its pump, adding memory to `machine` ([`XememPort`]'s `bridge_regions`).
    pub fn join_enclave(
        self: &Arc<Self>,
        ram: Arc<GuestRam>,
        wake: File,
        machine: Arc<dyn GuestRegions + Send + Sync>,
    ) -> Option<XememPort> {
        self.join_link(ram, wake, false, Some(machine))
    }

    /// A link to another daemon (`peer`): `frames` holds the files it passed.
    /// `upstream` says whether it is this sub-manager's link to the daemon above, the only
    /// link the way to the name server may be found on.
    pub(crate) fn join_peer(self: &Arc<Self>, frames: Arc<peer::PeerFrames>, wake: File, upstream: bool) -> Option<XememPort> {
        let regions: Arc<dyn GuestRegions + Send + Sync> = frames.clone();
        let mut port = self.join_link(frames, wake, true, Some(regions))?;
        port.upstream = upstream;
        Some(port)
    }

    pub(super) fn join_link(
        self: &Arc<Self>,
        ram: Arc<dyn FrameSource>,
        wake: File,
        peer: bool,
        bridge_regions: Option<Arc<dyn GuestRegions + Send + Sync>>,
    ) -> Option<XememPort> {
        let mut links = self.links.lock().unwrap();
        let link = (0..MAX_LINKS).find(|link| !links.outgoing.contains_key(link))?;
        let (sender, receiver) = mpsc::channel();
        links.outgoing.insert(link, Outbox { queue: sender, wake: Arc::new(wake) });
        links.ram.insert(link, ram);
        let bridge = Arc::new(Mutex::new(Bridge::default()));
        links.bridges.insert(link, bridge.clone());
        let (gone_sender, gone) = mpsc::channel();
        links.gone.insert(link, gone_sender);
        Some(XememPort {
            links: self.clone(),
            link,
            outgoing: receiver,
            gone,
            bridge,
            peer,
            bridge_regions,
            workers: Arc::default(),
            upstream: false,
            user: None,
        })
    }

    /// The node's messages go to their links' queues; finished requests to their callers.
    pub(super) fn deliver(&self, links: &mut Links) {
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
