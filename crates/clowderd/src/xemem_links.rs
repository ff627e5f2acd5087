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
//! `Failed` (EPROTO) by the node, never acted on. What the node cannot do yet is serve host
//! memory to an enclave or enclave memory to a host process: host processes' segments live
//! in the broker's own name server (`xemem-host`), not this node's.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use xemem::ids::SegmentId;
use xemem::node::{LinkId, LocalMemory, Node, Timing};
use xemem::wire::FrameRun;
use xemem::Error;

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
}

pub struct XememLinks {
    links: Mutex<Links>,
    started: Instant,
}

impl Default for XememLinks {
    fn default() -> Self {
        XememLinks {
            // Retries in milliseconds: the enclave's answers come within a ping round.
            links: Mutex::new(Links {
                node: Node::new(MAX_LINKS, true, Timing { retry_after: 500, attempts: 5 }),
                outgoing: HashMap::new(),
            }),
            started: Instant::now(),
        }
    }
}

impl XememLinks {
    pub fn new() -> Arc<XememLinks> {
        Arc::new(XememLinks::default())
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A new enclave's link; `None` when every link id is taken.
    pub fn join(self: &Arc<Self>) -> Option<XememPort> {
        let mut links = self.links.lock().unwrap();
        let link = (0..MAX_LINKS).find(|link| !links.outgoing.contains_key(link))?;
        let (sender, receiver) = mpsc::channel();
        links.outgoing.insert(link, sender);
        Some(XememPort { links: self.clone(), link, outgoing: receiver })
    }

    /// The node's messages go to their links' queues.
    fn deliver(links: &mut Links) {
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
        XememLinks::deliver(&mut links);
    }

    pub fn tick(&self) {
        let mut links = self.links.links.lock().unwrap();
        let now = self.links.now();
        links.node.tick(now, &mut NoHostMemory);
        XememLinks::deliver(&mut links);
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
        links.node.link_down(self.link, &mut NoHostMemory);
        XememLinks::deliver(&mut links);
    }
}
