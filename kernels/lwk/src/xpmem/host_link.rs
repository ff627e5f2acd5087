//! The enclave's XEMEM node (`xemem::node::Node`, not the name server) on its one link: the
//! channel to clowderd, whose node is the name server (enclave 1). Messages travel as
//! `enclave_proto` `Xemem` messages, one encoded `xemem::wire::Message` each
//! (docs/xemem.md).
//!
//! The node is sans I/O: the enclave's channel code hands it what the host sent
//! ([`from_host`]) and sends what it returns. There is no timer here, so the node's clock
//! advances when the host pings (every second), which paces its discovery of the name server.
//!
//! The node finds the name server and gets this enclave's id, serves attaches of the job's
//! segments that arrive from elsewhere, and takes the name server's notifications and
//! revokes. `/dev/xpmem`'s own requests (make, remove, get, release, attach, detach, lookup,
//! signal) go to the name server directly ([`direct`], [`attach`]), with the node's id: the
//! answers to makes and removes keep the node's list of the segments it serves
//! (`Node::note_served`). Segids are unique machine-wide, so host processes and other
//! enclaves can use the job's segments (and the job theirs: the daemon adds their memory as
//! guest-physical regions). The name server's `Revoke`s reach `super` through
//! [`LocalMemory::revoke`].

use super::SourceRun;
use crate::arch::sync::SpinLock;
use crate::clock;
use crate::console::log;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use xemem::ids::{AccessId, EnclaveId, SegmentId};
use xemem::node::{DirectRequest, LocalMemory, Node, Reply, Request, ServedChange, Timing, FIRST_UNCLAIMED_ID};
use xemem::wire::{self, FrameRun, Message};
use xemem::Error;

/// The channel is the node's only link.
const CHANNEL_LINK: u32 = 0;
/// The node's discovery of the name server repeats every half second.
const TIMING: Timing = Timing { retry_after: 500, attempts: 5 };
/// A direct request fails as `Unreachable` after this long without its answer. An attach of
/// another enclave's memory crosses the daemon and that enclave's kernel, each a thread on a
/// shared host: on a loaded two-core machine (load 12) 2.5 s was too short for UCX's FIFO
/// attaches in `MPI_Init`, both ranks attaching each other's at once (ETIMEDOUT, 2 runs of 10).
const DIRECT_TIMEOUT_MS: u64 = 10_000;

static NODE: SpinLock<Option<Node>> = SpinLock::new(None);
/// Processes whose segments are being removed because they end (or replace their image):
/// attaches of their memory are refused meanwhile (`JobMemory::resolve`).
static ENDING: SpinLock<Vec<u64>> = SpinLock::new(Vec::new());

/// Process `pid` of the job is ending, or replacing its image (the job goes on), its memory
/// still whole: its `segments` are removed at the name server, and this waits for every
/// answer, as `xpmem_remove` does. The daemon revokes the segments' attachments in host
/// processes and other enclaves before it answers a remove, so once this returns nobody
/// outside the enclave maps the process's frames and they may be freed and reused. Attaches
/// of its memory that arrive meanwhile are refused; one answered before is known to the
/// daemon before the remove reaches it (one channel, in order), so it is revoked too. Its
/// `permits` are released without waiting (they name other owners' memory). Returns false
/// when some remove got no answer (the name server is unreachable): the frames may still be
/// mapped elsewhere and must not be reused.
pub fn process_ended(pid: u64, segments: Vec<SegmentId>, permits: Vec<(u64, AccessId)>) -> bool {
    queue_abandoned(Vec::new(), permits);
    if segments.is_empty() || enclave_id().is_none() {
        return true;
    }
    ENDING.lock().push(pid);
    let removes: Vec<Result<u64, Error>> =
        segments.iter().map(|&segment| queue_direct(Request::Remove { process: pid, segment }, Waiter::Thread)).collect();
    crate::enclave::send_xemem();
    let deadline = now_ms() + DIRECT_TIMEOUT_MS;
    crate::enclave::serve_host_until(|| {
        removes.iter().all(|remove| remove.as_ref().map_or(true, |&id| direct_answered(id))) || now_ms() > deadline
    });
    let mut all_removed = true;
    for (remove, segment) in removes.into_iter().zip(&segments) {
        match remove.and_then(take_direct) {
            // Not found: it went already (the daemon removes a job's segments when the job ends).
            Ok(_) | Err(Error::NotFound) => {}
            Err(error) => {
                log!("xemem: process {pid} ended, but the remove of its segment {:#x} failed ({error:?}): its memory is kept until the job ends", segment.raw());
                all_removed = false;
            }
        }
    }
    ENDING.lock().retain(|&ending| ending != pid);
    all_removed
}

/// The job ended: its `segments` (each with the process that made it) go from the name
/// server too. The removes are only queued (this runs where the channel may be in use); they
/// leave with the next message this kernel sends, at the latest after the host's next ping.
/// Nobody waits for the answers. Its `permits` are released the same way, which makes the
/// host remove the regions behind their attachments (the job's address space is gone).
pub fn job_ended(segments: Vec<(u64, SegmentId)>, permits: Vec<(u64, AccessId)>) {
    // A thread killed while it waited for a direct request left its entry: answers to it are
    // dropped from now on.
    DIRECT.lock().clear();
    queue_abandoned(segments, permits);
}

/// Queues removes of `segments` and releases of `permits` (each with its process); nobody
/// waits for their answers.
fn queue_abandoned(segments: Vec<(u64, SegmentId)>, permits: Vec<(u64, AccessId)>) {
    let removes = segments.into_iter().map(|(process, segment)| Request::Remove { process, segment });
    let releases = permits.into_iter().map(|(process, access)| Request::Release { process, access });
    for request in removes.chain(releases) {
        // Fails only before the name server gave this enclave an id: nothing to undo then.
        let _ = queue_direct(request, Waiter::Nobody);
    }
}

/// Requests go to the name server around the node (`xemem::node::DirectRequest`): this
/// enclave's one link leads to the name server and loses and reorders nothing, and the node's
/// bookkeeping around each (a pending entry, retries, the outbox, completions) was a third of
/// a request's kernel instructions, each emulated on PVM. Their answers come straight off the
/// channel, or through the node when it served an attach itself (a segment of this enclave's
/// job: `Node::drain_unclaimed`).
static NEXT_DIRECT: AtomicU64 = AtomicU64::new(1);

/// Who takes a direct request's result.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// A job thread, which waits for it.
    Thread,
    /// Nobody: the request is dropped when answered.
    Nobody,
}

/// A direct request in flight, with its result once answered.
struct InFlight {
    request: DirectRequest,
    waiter: Waiter,
    result: Option<Result<Reply, Error>>,
}

/// Direct requests in flight (a few at a time).
static DIRECT: SpinLock<Vec<InFlight>> = SpinLock::new(Vec::new());

/// Asks the name server for `[offset, offset + size)` of the segment `segment` through permit
/// `access` of `process` and waits for the frames (`Reply::Attached`).
pub fn attach(process: u64, access: AccessId, segment: SegmentId, offset: u64, size: u64) -> Result<Reply, Error> {
    send_direct(|sequence, origin| DirectRequest::attach(sequence, origin, process, access, segment, offset, size))
}

/// Sends `request` (any but an attach) to the name server and waits for its answer.
pub fn direct(request: Request) -> Result<Reply, Error> {
    send_direct(|sequence, origin| DirectRequest::new(sequence, origin, request))
}

/// Builds the next direct request with `build` (from its sequence number and this enclave's
/// id), sends it and waits for its result (`Unreachable` after [`DIRECT_TIMEOUT_MS`]).
/// Inlined into each of its two callers, as the helpers below: a call and return is emulated
/// work on PVM.
#[inline(always)]
fn send_direct(build: impl FnOnce(u64, EnclaveId) -> Result<(DirectRequest, Message), Error>) -> Result<Reply, Error> {
    let id = start(build, Waiter::Thread)?;
    crate::enclave::send_xemem();
    let deadline = now_ms() + DIRECT_TIMEOUT_MS;
    crate::enclave::serve_host_until(|| direct_answered(id) || now_ms() > deadline);
    take_direct(id)
}

/// Queues `request` (any but an attach) for the name server, to go with the next message this
/// kernel sends; returns its id.
fn queue_direct(request: Request, waiter: Waiter) -> Result<u64, Error> {
    start(|sequence, origin| DirectRequest::new(sequence, origin, request), waiter)
}

/// Builds the next direct request with `build` and queues it for the host; returns its id.
#[inline(always)]
fn start(build: impl FnOnce(u64, EnclaveId) -> Result<(DirectRequest, Message), Error>, waiter: Waiter) -> Result<u64, Error> {
    let origin = enclave_id().ok_or(Error::Unreachable)?;
    let (request, message) = build(NEXT_DIRECT.fetch_add(1, Ordering::Relaxed), origin)?;
    let id = request.id();
    DIRECT.lock().push(InFlight { request, waiter, result: None });
    push_encoded(&mut OUTGOING.lock(), &message);
    Ok(id)
}

#[inline(always)]
fn direct_answered(id: u64) -> bool {
    DIRECT.lock().iter().any(|in_flight| in_flight.request.id() == id && in_flight.result.is_some())
}

/// Takes direct request `id` out of the list, with its result (`Unreachable` if unanswered).
#[inline(always)]
fn take_direct(id: u64) -> Result<Reply, Error> {
    let mut direct = DIRECT.lock();
    let index = direct.iter().position(|in_flight| in_flight.request.id() == id);
    index.and_then(|index| direct.swap_remove(index).result).unwrap_or(Err(Error::Unreachable))
}

/// An answer to a direct request, off the channel.
fn direct_answer(bytes: &[u8]) {
    let message = match Message::decode(bytes) {
        Ok(message) => message,
        Err(_) => return log!("xemem: a malformed answer to a direct request; dropped"),
    };
    if let Some(change) = claim_direct(message) {
        if let Some(node) = NODE.lock().as_mut() {
            node.note_served(change);
        }
    }
}

/// Gives `message` to the direct request in flight it answers, if any (a late answer, whose
/// request timed out or whose job ended, is dropped; so is one its request does not take).
/// Returns what the answer changes in the segments the node serves, for the caller to note
/// before the next message (only makes and removes need the node).
fn claim_direct(Message { header, body }: Message) -> Option<ServedChange> {
    let mut direct = DIRECT.lock();
    let in_flight = direct.iter_mut().find(|in_flight| in_flight.request.id() == header.request && in_flight.result.is_none())?;
    let result = in_flight.request.answer(header.origin, body)?;
    let change = in_flight.request.served_change(&result);
    in_flight.result = Some(result);
    if in_flight.waiter == Waiter::Nobody {
        direct.retain(|in_flight| in_flight.waiter == Waiter::Thread || in_flight.result.is_none());
    }
    change
}

/// The job's memory, for attaches of its processes' segments that arrive from elsewhere:
/// guest-physical frame runs from the owner's page tables (the host bounds-checks them
/// against this enclave's RAM). XEMEM processes are the job's pids.
struct JobMemory;

impl LocalMemory for JobMemory {
    fn resolve(&mut self, process: u64, vaddr: u64, size: u64) -> Result<Vec<FrameRun>, Error> {
        if !crate::job::is_loaded() || ENDING.lock().contains(&process) {
            return Err(Error::NotFound);
        }
        let runs: Vec<SourceRun> = super::resolve(process, vaddr, size).ok_or(Error::NotFound)?;
        Ok(runs.iter().map(|run| FrameRun { first: run.first, frames: run.frames }).collect())
    }
    fn notify(&mut self, process: u64, segment: SegmentId) {
        super::notify(process, segment);
    }
    fn revoke(&mut self, process: u64, access: AccessId) {
        super::revoke_global_permit(process, access);
    }
}

fn now_ms() -> u64 {
    clock::monotonic_ns() / 1_000_000
}

/// Encoded messages for the host, each a u32 length and the bytes, in the order the node
/// produced them: one buffer that keeps its room (every allocation is emulated work on PVM).
/// Whoever holds the channel next sends them all ([`send_queued`]). Taken after NODE and after
/// the channel's state, never before.
static OUTGOING: SpinLock<Vec<u8>> = SpinLock::new(Vec::new());

/// Encodes what the node wants sent (everything goes out on the channel) into OUTGOING.
fn queue_outbox(node: &mut Node) {
    if !node.has_outbox() {
        return;
    }
    let mut outgoing = OUTGOING.lock();
    for (link, message) in node.drain_outbox() {
        if link == CHANNEL_LINK {
            push_encoded(&mut outgoing, &message);
        }
    }
}

/// Appends `message` to OUTGOING's buffer, length first (nothing if it cannot be encoded).
fn push_encoded(outgoing: &mut Vec<u8>, message: &Message) {
    let at = outgoing.len();
    outgoing.extend_from_slice(&[0; 4]);
    if message.encode(outgoing).is_err() {
        outgoing.truncate(at);
        return;
    }
    let len = (outgoing.len() - at - 4) as u32;
    outgoing[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Hands every queued message to `send`, in order, and empties the queue. The caller holds
/// the channel.
pub fn send_queued(mut send: impl FnMut(&[u8])) {
    let mut outgoing = OUTGOING.lock();
    let mut rest = &outgoing[..];
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let (message, after) = tail.split_at(u32::from_le_bytes(*len) as usize);
        send(message);
        rest = after;
    }
    outgoing.clear();
}

/// The channel is up: start looking for the name server (messages queued for the host).
pub fn link_up() {
    let mut node = Node::new(1, None, TIMING);
    node.tick(now_ms(), &mut JobMemory);
    queue_outbox(&mut node);
    *NODE.lock() = Some(node);
}

/// One XEMEM message from the host (decoded and validated by the node, which answers a
/// malformed one with an error); what the node answers is queued for the host.
pub fn from_host(bytes: &[u8]) {
    // Requests the name server sends on a direct request's behalf (an attach for the node to
    // serve) carry its id too: only answers are the direct path's.
    if wire::answered_request(bytes).is_some_and(|id| id >= FIRST_UNCLAIMED_ID) {
        return direct_answer(bytes);
    }
    let mut guard = NODE.lock();
    let Some(node) = guard.as_mut() else { return };
    let had_id = node.id().is_some();
    // No tick here: the node's clock (retries, discovery) moves with the host's pings and
    // this kernel's own requests; a tick per message was about 0.2 ms of emulated work.
    node.receive(CHANNEL_LINK, bytes, &mut JobMemory);
    if node.has_unclaimed() {
        let answers: Vec<Message> = node.drain_unclaimed().collect();
        for change in answers.into_iter().filter_map(claim_direct) {
            node.note_served(change);
        }
    }
    if let (false, Some(id)) = (had_id, node.id()) {
        log!("xemem: the name server gave this enclave id {id}");
    }
    queue_outbox(node);
}

/// Time passes (the host pinged): the node's discovery, queued for the host.
pub fn tick() {
    let mut guard = NODE.lock();
    let Some(node) = guard.as_mut() else { return };
    node.tick(now_ms(), &mut JobMemory);
    queue_outbox(node);
}

/// This enclave's XEMEM id, once the name server gave one.
pub fn enclave_id() -> Option<EnclaveId> {
    NODE.lock().as_ref().and_then(Node::id)
}
