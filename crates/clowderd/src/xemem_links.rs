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
//! which a host process can map: no copy. Not yet done: host processes' own segments live in
//! the broker's name server (`xemem-host`), not this node's, so libxpmem does not reach
//! enclave segments yet, and an enclave cannot attach host memory.

use std::collections::HashMap;
use std::fs::File;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xemem::ids::{AccessId, SegmentId};
use xemem::node::{Completion, LinkId, LocalMemory, Node, Reply, Request, Timing};
use xemem::wire::{FrameRun, Name};
use xemem::{Credentials, Error};

use crate::guest_ram::GuestRam;

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
}

struct Links {
    node: Node,
    /// Where to put each link's outgoing messages (its pump sends them).
    outgoing: HashMap<LinkId, mpsc::Sender<Vec<u8>>>,
    /// The RAM of the enclave behind each link: frame runs it sends are checked against it.
    ram: HashMap<LinkId, Arc<GuestRam>>,
    /// Finished requests of host callers, until they collect them.
    finished: HashMap<u64, Result<Reply, Error>>,
}

pub struct XememLinks {
    links: Mutex<Links>,
    /// Signalled whenever requests finish.
    finished: Condvar,
    started: Instant,
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
        XememLinks {
            // Retries in milliseconds: the enclave's answers come within a ping round.
            links: Mutex::new(Links {
                node: Node::new(MAX_LINKS, true, Timing { retry_after: 500, attempts: 5 }),
                outgoing: HashMap::new(),
                ram: HashMap::new(),
                finished: HashMap::new(),
            }),
            finished: Condvar::new(),
            started: Instant::now(),
        }
    }
}

impl XememLinks {
    pub fn new() -> Arc<XememLinks> {
        Arc::new(XememLinks::default())
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
        let attached = self.call(Request::Attach { process, access, offset, size });
        let runs = match attached {
            Ok(Reply::Attached { runs, .. }) => runs,
            Ok(_) => return Err(Error::Malformed),
            Err(error) => {
                let _ = self.release(process, access);
                return Err(error);
            }
        };
        let ram = {
            let links = self.links.lock().unwrap();
            links.node.route(segment.enclave()).and_then(|link| links.ram.get(&link).cloned())
        };
        let Some(ram) = ram else {
            let _ = self.release(process, access);
            return Err(Error::Unreachable);
        };
        match file_runs(&ram, &runs) {
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

    /// The RAM of the enclave that owns `segment`, while it is linked.
    fn owner_ram(&self, segment: SegmentId) -> Option<Arc<GuestRam>> {
        let links = self.links.lock().unwrap();
        links.node.route(segment.enclave()).and_then(|link| links.ram.get(&link).cloned())
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
        let (segment, runs) = match self.call(Request::Attach { process, access, offset, size })? {
            Reply::Attached { segment, runs } => (segment, runs),
            _ => return Err(Error::Malformed),
        };
        let checked = self.owner_ram(segment).ok_or(Error::Unreachable).and_then(|ram| file_runs(&ram, &runs));
        let runs = match checked {
            Ok(runs) => runs,
            Err(error) => {
                let _ = self.call(Request::Detach { process, access });
                return Err(error);
            }
        };
        Ok(runs
            .into_iter()
            .map(|run| match run {
                FileRun::Memory { file, offset, len } => xemem_host::EnclaveRun::Memory { file: file.into(), offset, length: len },
                FileRun::Hole { len } => xemem_host::EnclaveRun::Hole { length: len },
            })
            .collect())
    }

    fn detach(&self, process: u64, access: AccessId) -> Result<(), Error> {
        self.call(Request::Detach { process, access }).map(|_| ())
    }

    fn release(&self, process: u64, access: AccessId) -> Result<(), Error> {
        XememLinks::release(self, process, access)
    }
}

impl XememLinks {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A new enclave's link; `None` when every link id is taken. `ram` is the enclave's RAM.
    pub fn join(self: &Arc<Self>, ram: Arc<GuestRam>) -> Option<XememPort> {
        let mut links = self.links.lock().unwrap();
        let link = (0..MAX_LINKS).find(|link| !links.outgoing.contains_key(link))?;
        let (sender, receiver) = mpsc::channel();
        links.outgoing.insert(link, sender);
        links.ram.insert(link, ram);
        Some(XememPort { links: self.clone(), link, outgoing: receiver })
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
                let _ = queue.send(bytes);
            }
        }
    }
}

/// Checks every frame run against the enclave's RAM and names it as a range of the RAM memfd.
pub fn file_runs(ram: &GuestRam, runs: &[FrameRun]) -> Result<Vec<FileRun>, Error> {
    let page = xemem::PAGE_SIZE;
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let len = run.frames.checked_mul(page).ok_or(Error::Invalid)?;
        match run.first {
            None => out.push(FileRun::Hole { len }),
            Some(first) => {
                let gpa = first.checked_mul(page).ok_or(Error::Invalid)?;
                let (file, offset) = ram.file_range(gpa, len).map_err(|_| Error::Invalid)?;
                let file = file.try_clone().map_err(|_| Error::Exhausted)?;
                out.push(FileRun::Memory { file, offset, len });
            }
        }
    }
    Ok(out)
}

/// One enclave's end of the host's node.
pub struct XememPort {
    links: Arc<XememLinks>,
    link: LinkId,
    outgoing: mpsc::Receiver<Vec<u8>>,
}

impl XememPort {
    pub fn link(&self) -> LinkId {
        self.link
    }

    /// One message the enclave sent (not yet decoded: the node validates it).
    pub fn from_enclave(&self, bytes: &[u8]) {
        let mut links = self.links.links.lock().unwrap();
        let now = self.links.now();
        links.node.tick(now, &mut NoHostMemory);
        links.node.receive(self.link, bytes, &mut NoHostMemory);
        self.links.deliver(&mut links);
    }

    pub fn tick(&self) {
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
        let mut links = self.links.links.lock().unwrap();
        links.outgoing.remove(&self.link);
        links.ram.remove(&self.link);
        links.node.link_down(self.link, &mut NoHostMemory);
        self.links.deliver(&mut links);
    }
}
