//! One enclave's XEMEM engine (paper section 3.2): it finds the name server by broadcasting on
//! every link, asks for an enclave id through the link the first answer came on, learns which
//! link leads to every enclave id handed out through it, forwards what it does not know towards
//! the name server, runs the name server if it is the name-server enclave, serves attaches of
//! the segments its processes own, and retries its own requests.
//!
//! Sans I/O: feed it received bytes with [`Node::receive`] and the time with [`Node::tick`];
//! take what it wants sent from [`Node::outbox`] and finished requests from
//! [`Node::completions`]. Links are small numbers the caller chooses; a link is assumed to
//! connect exactly two enclaves, and it may lose or reorder messages.
//!
//! Every answer is matched to its request by request id *and* kind *and* (for attach) the
//! segment the permit was granted on and the owner that must answer (or the name server's
//! enclave, which may serve memory on the owner's behalf), so a late, duplicated or misrouted
//! answer is dropped instead of completing the wrong request. Requests are retried
//! with the same id; the name server keeps its recent answers per (origin, request id) and
//! repeats them, so a retried make or get is not done twice.

use crate::answers::AnswerCache;
use crate::ids::{AccessId, EnclaveId, SegmentId, NAME_SERVER_ENCLAVE};
use crate::nameserver::{self, NameServer, Principal};
use crate::perm::{Credentials, Owner};
use crate::vecmap::VecMap;
use crate::wire::{self, Body, FrameRun, Header, ListEntry, MappingWord, Message, Name, RunAssembler, HEADER_LEN};
use crate::Error;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

pub type LinkId = u32;

/// What a node needs from its kernel to serve attaches and deliver signals.
pub trait LocalMemory {
    /// Frames backing `[vaddr, vaddr + size)` of `process`, as runs; holes where nothing is
    /// mapped. The pages must add up to `size`.
    fn resolve(&mut self, process: u64, vaddr: u64, size: u64) -> Result<Vec<FrameRun>, Error>;
    /// An attacher signalled `segment`, owned by `process`.
    fn notify(&mut self, process: u64, segment: SegmentId);
    /// The memory `process` attached through permit `access` is being taken away (its owner
    /// removed the segment or is gone): unmap those attachments, keeping their ranges
    /// reserved so a touch faults (SIGBUS), before this returns. The permit is void.
    fn revoke(&mut self, process: u64, access: AccessId);
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Make { process: u64, vaddr: u64, size: u64, owner: Owner, name: Option<Name> },
    Remove { process: u64, segment: SegmentId },
    Get { process: u64, segment: SegmentId, access: u32, credentials: Credentials },
    Release { process: u64, access: AccessId },
    Attach { process: u64, access: AccessId, offset: u64, size: u64 },
    Detach { process: u64, access: AccessId },
    Lookup { name: Name },
    List { after: i64 },
    Signal { process: u64, access: AccessId },
}

impl Request {
    /// The message body that asks for this, checked as the name server will check it (a bad
    /// argument fails here, without a round trip).
    pub fn into_body(self) -> Result<Body, Error> {
        Ok(match self {
            Request::Make { process, vaddr, size, owner, name } => {
                nameserver::validate_range(vaddr, size)?;
                Body::Make { process, vaddr, size, uid: owner.uid, gid: owner.gid, mode: owner.mode, name }
            }
            Request::Remove { process, segment } => Body::Remove { process, segment },
            Request::Get { process, segment, access, credentials } => {
                crate::validate_access_flags(access)?;
                if credentials.groups.len() > crate::perm::MAX_GROUPS {
                    return Err(Error::Invalid);
                }
                Body::Get { process, segment, access, uid: credentials.uid, groups: credentials.groups }
            }
            Request::Release { process, access } => Body::Release { process, access },
            Request::Attach { process, access, offset, size } => {
                if offset % crate::PAGE_SIZE != 0 || size == 0 || size % crate::PAGE_SIZE != 0 {
                    return Err(Error::Invalid);
                }
                Body::Attach { process, access, offset, size }
            }
            Request::Detach { process, access } => Body::Detach { process, access },
            Request::Lookup { name } => Body::Lookup { name },
            Request::List { after } => Body::List { after },
            Request::Signal { process, access } => Body::Signal { process, access },
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Made(SegmentId),
    Done,
    Granted {
        access: AccessId,
        size: u64,
    },
    /// The frames, and the word that says whether they still hold (see [`MappingWord`]).
    Attached {
        segment: SegmentId,
        runs: Vec<FrameRun>,
        valid_while: Option<MappingWord>,
    },
    Found(SegmentId),
    Listed {
        more: bool,
        entries: Vec<ListEntry>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub request: u64,
    pub result: Result<Reply, Error>,
}

struct Pending {
    /// Sent again as it was on a retry.
    body: Body,
    sent_at: u64,
    attempts: u32,
    expectation: Expectation,
}

/// Retry policy, in the caller's time units.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub retry_after: u64,
    pub attempts: u32,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { retry_after: 100, attempts: 5 }
    }
}

const REPLY_CACHE: usize = 4096;

pub struct Node {
    id: EnclaveId,
    links: u32,
    timing: Timing,
    name_server: Option<NameServer>,
    /// Answers the name server gave, so a retried request gets the same answer.
    replies: AnswerCache<Vec<Message>, REPLY_CACHE>,
    towards_name_server: Option<LinkId>,
    routes: BTreeMap<EnclaveId, LinkId>,
    /// Enclave-id requests passed upstream: our token -> (link it came from, its token).
    forwarded: BTreeMap<u64, (LinkId, u64)>,
    own_token: Option<u64>,
    next_token: u64,
    last_discovery: Option<u64>,
    next_request: u64,
    pending: VecMap<u64, Pending>,
    /// Which segment each permit we were granted is on (to check attach answers).
    granted: VecMap<AccessId, SegmentId>,
    /// Segments our processes own: id -> (process, vaddr, size).
    owned: VecMap<SegmentId, (u64, u64, u64)>,
    now: u64,
    outbox: Vec<(LinkId, Message)>,
    local: VecDeque<Message>,
    completions: Vec<Completion>,
    /// Answers addressed to this enclave for requests the node did not start (see
    /// [`Node::drain_unclaimed`]); at most [`MAX_UNCLAIMED`] wait.
    unclaimed: Vec<Message>,
}

/// Unclaimed answers kept until drained; later ones are dropped, as the node drops answers
/// it cannot match.
const MAX_UNCLAIMED: usize = 64;
/// Request ids from here up are never the node's (it counts from 1): its kernel may use them
/// for requests of its own ([`DirectRequest`], [`Node::drain_unclaimed`]).
pub const FIRST_UNCLAIMED_ID: u64 = 1 << 63;

/// A request an enclave's kernel sends to the name server itself, around its node: over a
/// link that loses and reorders nothing (an enclave's channel) it needs neither the node's
/// routing nor its retries, whose bookkeeping is most of a request's cost in an emulated
/// kernel. It has an id the node never uses, and its answers are judged by the code that
/// judges the node's own (`Expectation`: the name server answers, or for an attach the
/// segment's owner; the kind, a make's segment enclave, and an attach's segment and size, must
/// match), except that an attach answer's part out of place fails the request: with no loss or
/// reordering there is nothing to retry for.
/// The answers to makes and removes change what the enclave's node serves
/// ([`DirectRequest::served_change`], [`Node::note_served`]).
pub struct DirectRequest {
    id: u64,
    expectation: Expectation,
}

/// What a request takes as its answer, and an attach's answer parts so far: the one
/// judgement of answers, for the node's own requests and for direct ones.
struct Expectation {
    /// The asking enclave: a segment it makes is one of its own.
    origin: EnclaveId,
    expects: Expects,
    assembler: RunAssembler,
}

/// How a message answers a request ([`Expectation::judge`]).
enum Verdict {
    /// Not at all: another enclave, kind, segment or size.
    NotAnAnswer,
    /// A part of an attach's answer, with more to come.
    Part,
    /// A part of an attach's answer out of place: one went missing, came twice or early.
    PartOutOfPlace(Error),
    Answered(Result<Reply, Error>),
}

/// The answer a request takes (the node's own or a direct one).
#[derive(Clone, Copy)]
enum Expects {
    Done,
    /// A segment of the asking enclave; `process` owns `[vaddr, vaddr + length)`.
    Made {
        process: u64,
        vaddr: u64,
        length: u64,
    },
    /// Done, and the node stops serving `segment`.
    Removed {
        segment: SegmentId,
    },
    /// Done, and the permit `access` is void.
    Released {
        access: AccessId,
    },
    /// A permit on `segment`.
    Granted {
        segment: SegmentId,
    },
    Found,
    Listed,
    /// The segment the attach's permit is on, and the size asked.
    Attached {
        segment: SegmentId,
        size: u64,
    },
}

/// What the answer to a direct make or remove changes in the segments a node serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServedChange {
    /// `process` made `segment` over `[vaddr, vaddr + length)`.
    Made {
        segment: SegmentId,
        process: u64,
        vaddr: u64,
        length: u64,
    },
    Removed {
        segment: SegmentId,
    },
}

impl DirectRequest {
    /// The `sequence`-th direct request of enclave `origin`, any but an attach
    /// ([`DirectRequest::attach`]). Returns the message to send.
    #[inline] // into a kernel's request path, where every instruction counts (PVM emulates them)
    pub fn new(sequence: u64, origin: EnclaveId, request: Request) -> Result<(DirectRequest, Message), Error> {
        let expects = Expects::of(&request).ok_or(Error::Invalid)?;
        DirectRequest::start(sequence, origin, request, expects)
    }

    /// The `sequence`-th direct request of enclave `origin`: attach `[offset, offset + size)`
    /// through `access`, a permit of `process` on `segment`.
    pub fn attach(
        sequence: u64,
        origin: EnclaveId,
        process: u64,
        access: AccessId,
        segment: SegmentId,
        offset: u64,
        size: u64,
    ) -> Result<(DirectRequest, Message), Error> {
        DirectRequest::start(sequence, origin, Request::Attach { process, access, offset, size }, Expects::Attached { segment, size })
    }

    fn start(sequence: u64, origin: EnclaveId, request: Request, expects: Expects) -> Result<(DirectRequest, Message), Error> {
        let id = FIRST_UNCLAIMED_ID | sequence;
        let message = Message::new(id, origin, NAME_SERVER_ENCLAVE, request.into_body()?);
        Ok((DirectRequest { id, expectation: Expectation::new(origin, expects) }, message))
    }

    /// The id its answers carry.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Judges `body`, from enclave `from`, as an answer to this request: its result, or `None`
    /// if it does not answer it (an enclave that may not, another kind, another segment or
    /// size) or is a part of an attach's answer with more to come. A part out of place fails
    /// the request: over a link that neither loses nor reorders there is nothing to wait for.
    pub fn answer(&mut self, from: EnclaveId, body: Body) -> Option<Result<Reply, Error>> {
        match self.expectation.judge(from, body) {
            Verdict::NotAnAnswer | Verdict::Part => None,
            Verdict::PartOutOfPlace(error) => Some(Err(error)),
            Verdict::Answered(result) => Some(result),
        }
    }

    /// What `result`, this request's answer ([`DirectRequest::answer`]), changes in the
    /// segments the asking enclave's node serves: a segment made, or removed.
    pub fn served_change(&self, result: &Result<Reply, Error>) -> Option<ServedChange> {
        self.expectation.expects.served_change(result)
    }
}

impl Expects {
    /// What `request` takes as its answer; `None` for an attach, whose answer depends on the
    /// segment its permit is on.
    fn of(request: &Request) -> Option<Expects> {
        Some(match *request {
            Request::Make { process, vaddr, size, .. } => {
                Expects::Made { process, vaddr, length: nameserver::validate_range(vaddr, size).ok()? }
            }
            Request::Remove { segment, .. } => Expects::Removed { segment },
            Request::Release { access, .. } => Expects::Released { access },
            Request::Detach { .. } | Request::Signal { .. } => Expects::Done,
            Request::Get { segment, .. } => Expects::Granted { segment },
            Request::Lookup { .. } => Expects::Found,
            Request::List { .. } => Expects::Listed,
            Request::Attach { .. } => return None,
        })
    }

    /// What `result`, the answer to a request that expected this, changes in the segments the
    /// asking enclave's node serves.
    fn served_change(self, result: &Result<Reply, Error>) -> Option<ServedChange> {
        match (self, result) {
            (Expects::Made { process, vaddr, length }, Ok(Reply::Made(segment))) => {
                Some(ServedChange::Made { segment: *segment, process, vaddr, length })
            }
            // Not found: gone already (its enclave's job ended, say); not to be served either.
            (Expects::Removed { segment }, Ok(Reply::Done) | Err(Error::NotFound)) => Some(ServedChange::Removed { segment }),
            _ => None,
        }
    }
}

impl Expectation {
    fn new(origin: EnclaveId, expects: Expects) -> Expectation {
        Expectation { origin, expects, assembler: RunAssembler::default() }
    }

    /// Forgets the parts of a multi-part answer gathered so far: its next attempt is answered
    /// from the first part again.
    fn start_over(&mut self) {
        self.assembler = RunAssembler::default();
    }

    /// Judges `body`, from enclave `from`: only the name server answers, or for an attach
    /// also the segment's owner (the name server's enclave may answer an attach itself: a host
    /// that maps another machine's memory into ours answers with the frames it added on the
    /// owner's behalf).
    #[inline(always)] // into each caller: an emulating kernel pays for every call and move
    fn judge(&mut self, from: EnclaveId, body: Body) -> Verdict {
        let owner = match self.expects {
            Expects::Attached { segment, .. } => Some(segment.enclave()),
            _ => None,
        };
        if from != NAME_SERVER_ENCLAVE && Some(from) != owner {
            return Verdict::NotAnAnswer;
        }
        let result = match (&self.expects, body) {
            (_, Body::Failed { error }) => Err(error),
            (Expects::Done | Expects::Removed { .. } | Expects::Released { .. }, Body::Done) => Ok(Reply::Done),
            (Expects::Made { .. }, Body::Made { segment }) if segment.enclave() == self.origin => Ok(Reply::Made(segment)),
            (Expects::Granted { .. }, Body::Granted { access, size }) => Ok(Reply::Granted { access, size }),
            (Expects::Found, Body::Found { segment }) => Ok(Reply::Found(segment)),
            (Expects::Listed, Body::Listed { more, entries }) => Ok(Reply::Listed { more, entries }),
            (&Expects::Attached { segment, size: asked }, Body::Attached(part)) if part.segment == segment && part.size == asked => {
                match self.assembler.push(part) {
                    Ok(None) => return Verdict::Part,
                    Ok(Some((runs, valid_while))) => Ok(Reply::Attached { segment, runs, valid_while }),
                    Err(error) => return Verdict::PartOutOfPlace(error),
                }
            }
            _ => return Verdict::NotAnAnswer,
        };
        Verdict::Answered(result)
    }
}

impl Node {
    /// An enclave with `links` links (numbered `0..links`); one that runs `name_server` is
    /// enclave 1.
    pub fn new(links: u32, name_server: Option<NameServer>, timing: Timing) -> Node {
        Node {
            id: if name_server.is_some() { NAME_SERVER_ENCLAVE } else { 0 },
            links,
            timing,
            name_server,
            replies: AnswerCache::default(),
            towards_name_server: None,
            routes: BTreeMap::new(),
            forwarded: BTreeMap::new(),
            own_token: None,
            next_token: 1,
            last_discovery: None,
            next_request: 1,
            pending: VecMap::default(),
            granted: VecMap::default(),
            owned: VecMap::default(),
            now: 0,
            outbox: Vec::new(),
            local: VecDeque::new(),
            completions: Vec::new(),
            unclaimed: Vec::new(),
        }
    }

    /// This enclave's id, once the name server has handed one out.
    pub fn id(&self) -> Option<EnclaveId> {
        (self.id != 0).then_some(self.id)
    }
    pub fn link_towards_name_server(&self) -> Option<LinkId> {
        self.towards_name_server
    }
    pub fn route(&self, enclave: EnclaveId) -> Option<LinkId> {
        self.routes.get(&enclave).copied()
    }
    /// The enclaves this node reaches through `link`.
    pub fn enclaves_via(&self, link: LinkId) -> Vec<EnclaveId> {
        self.routes.iter().filter(|(_, l)| **l == link).map(|(e, _)| *e).collect()
    }
    pub fn name_server(&self) -> Option<&NameServer> {
        self.name_server.as_ref()
    }
    /// The name server, for its host's own bookkeeping (e.g. removing the segments of an
    /// enclave's finished job); the node's routes and requests are untouched.
    pub fn name_server_mut(&mut self) -> Option<&mut NameServer> {
        self.name_server.as_mut()
    }
    pub fn outbox(&mut self) -> Vec<(LinkId, Message)> {
        core::mem::take(&mut self.outbox)
    }
    pub fn completions(&mut self) -> Vec<Completion> {
        core::mem::take(&mut self.completions)
    }
    /// [`Node::outbox`] that keeps the node's buffer: no allocation per message, for a caller
    /// that pays for each (an enclave kernel).
    pub fn drain_outbox(&mut self) -> alloc::vec::Drain<'_, (LinkId, Message)> {
        self.outbox.drain(..)
    }
    /// [`Node::completions`] that keeps the node's buffer, as [`Node::drain_outbox`].
    pub fn drain_completions(&mut self) -> alloc::vec::Drain<'_, Completion> {
        self.completions.drain(..)
    }
    /// Whether [`Node::drain_outbox`] would yield anything: a look is cheaper than draining
    /// nothing, for a caller paying per instruction.
    pub fn has_outbox(&self) -> bool {
        !self.outbox.is_empty()
    }
    /// Whether [`Node::drain_completions`] would yield anything, as [`Node::has_outbox`].
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }
    /// Answers that came to this enclave for requests the node did not start: its kernel's own,
    /// sent to the name server with ids the node never hands out (the top bit set), whose
    /// answer may come back through the node, e.g. when the node itself served the attach of a
    /// segment of its own enclave. The caller matches them; the node only hands them on.
    pub fn drain_unclaimed(&mut self) -> alloc::vec::Drain<'_, Message> {
        self.unclaimed.drain(..)
    }
    /// Whether [`Node::drain_unclaimed`] would yield anything, as [`Node::has_outbox`].
    pub fn has_unclaimed(&self) -> bool {
        !self.unclaimed.is_empty()
    }
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Advances time: rediscovers the name server or re-asks for an id while we have none,
    /// and retries (or gives up on) our requests.
    pub fn tick(&mut self, now: u64, memory: &mut dyn LocalMemory) {
        self.now = now;
        if self.id == 0 {
            let due = self.last_discovery.is_none_or(|t| now.saturating_sub(t) >= self.timing.retry_after);
            if due {
                self.last_discovery = Some(now);
                match self.towards_name_server {
                    None => {
                        for link in 0..self.links {
                            self.outbox.push((link, Message::new(0, 0, 0, Body::PingNameServer)));
                        }
                    }
                    Some(link) => self.ask_for_id(link),
                }
            }
        }
        let due: Vec<u64> =
            self.pending.iter().filter(|(_, p)| now.saturating_sub(p.sent_at) >= self.timing.retry_after).map(|(r, _)| *r).collect();
        for request in due {
            let Some(p) = self.pending.get_mut(&request) else { continue };
            if p.attempts >= self.timing.attempts {
                self.pending.remove(&request);
                self.completions.push(Completion { request, result: Err(Error::Unreachable) });
                continue;
            }
            p.attempts += 1;
            p.sent_at = now;
            p.expectation.start_over();
            let body = p.body.clone();
            self.send(Message::new(request, self.id, NAME_SERVER_ENCLAVE, body));
        }
        self.run_local(memory);
    }

    /// Sets the node's clock without `tick`'s look for due retries and discovery: for a
    /// caller whose ticks come on their own schedule, before a `request` (which notes when it
    /// was sent).
    pub fn set_clock(&mut self, now: u64) {
        self.now = now;
    }

    /// A link is gone (the enclave behind it crashed or was torn down): forget every enclave
    /// reached through it and tell the name server, which drops their segments and permits.
    pub fn link_down(&mut self, link: LinkId, memory: &mut dyn LocalMemory) {
        let gone = self.enclaves_via(link);
        self.forwarded.retain(|_, (l, _)| *l != link);
        if self.towards_name_server == Some(link) {
            // Cut off from the name server: rediscover it (our id stays ours).
            self.towards_name_server = None;
        }
        for enclave in gone {
            self.routes.remove(&enclave);
            if let Some(ns) = self.name_server.as_mut() {
                ns.forget_enclave(enclave);
                self.forget_replies(enclave);
            } else {
                self.send(Message::new(0, self.id, NAME_SERVER_ENCLAVE, Body::EnclaveGone { enclave }));
            }
        }
        self.run_local(memory);
    }

    /// The name server that gave this node its id is gone for good: the link towards it went
    /// down, so it (or a hop on the way, which took every enclave behind it along) forgot
    /// this node, and a name server found again will not know its id. Everything that came
    /// from it goes: the id, the routes to the enclaves below (their ids were its too), the
    /// segments made and permits granted there, and every pending request (it fails with
    /// `Unreachable`). The next [`Node::tick`] looks for a name server again and asks it for
    /// a new id. A name server's own node has nothing to rejoin. Each enclave below is told
    /// that its id is gone (`EnclaveGone` naming it, sent down its link), so it rejoins too.
    pub fn rejoin(&mut self) {
        if self.name_server.is_some() {
            return;
        }
        let below: Vec<(EnclaveId, LinkId)> = self.routes.iter().map(|(&enclave, &link)| (enclave, link)).collect();
        for (enclave, link) in below {
            self.outbox.push((link, Message::new(0, 0, 0, Body::EnclaveGone { enclave })));
        }
        self.id = 0;
        self.own_token = None;
        self.towards_name_server = None;
        self.last_discovery = None;
        self.routes.clear();
        self.forwarded.clear();
        self.granted.clear();
        self.owned.clear();
        self.local.clear();
        for (request, _) in self.pending.take() {
            self.completions.push(Completion { request, result: Err(Error::Unreachable) });
        }
    }

    /// How many answers the name server keeps for retries of `enclave`'s requests.
    pub fn cached_answers_for(&self, enclave: EnclaveId) -> usize {
        self.replies.count_for(enclave)
    }

    fn forget_replies(&mut self, enclave: EnclaveId) {
        self.replies.forget(enclave);
    }

    fn ask_for_id(&mut self, link: LinkId) {
        let token = self.fresh_token();
        self.own_token = Some(token);
        self.outbox.push((link, Message::new(0, 0, 0, Body::EnclaveIdRequest { token })));
    }

    fn fresh_token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    /// Keeps the segments this node serves as the answers to direct makes and removes say
    /// ([`DirectRequest::served_change`]). Call it as each answer arrives, before the next
    /// message: an attach of a new segment may follow its make's answer at once.
    pub fn note_served(&mut self, change: ServedChange) {
        match change {
            ServedChange::Made { segment, process, vaddr, length } => {
                self.owned.insert(segment, (process, vaddr, length));
            }
            ServedChange::Removed { segment } => {
                self.owned.remove(&segment);
            }
        }
    }

    /// Starts a request; its answer arrives as a [`Completion`] with the returned id.
    pub fn request(&mut self, request: Request, memory: &mut dyn LocalMemory) -> Result<u64, Error> {
        if self.id == 0 {
            return Err(Error::Unreachable);
        }
        let expects = match &request {
            Request::Attach { access, size, .. } => self.granted.get(access).map(|&segment| Expects::Attached { segment, size: *size }),
            other => Expects::of(other),
        };
        let body = request.into_body()?;
        // Only a permit this node was granted (and still holds) says which segment's frames
        // may answer an attach.
        let expectation = Expectation::new(self.id, expects.ok_or(Error::NotFound)?);
        let request = self.next_request;
        self.next_request += 1;
        self.pending.insert(request, Pending { body: body.clone(), sent_at: self.now, attempts: 1, expectation });
        self.send(Message::new(request, self.id, NAME_SERVER_ENCLAVE, body));
        self.run_local(memory);
        Ok(request)
    }

    /// Handles bytes received on `link`. A malformed request is answered with `Failed`.
    pub fn receive(&mut self, link: LinkId, bytes: &[u8], memory: &mut dyn LocalMemory) {
        if link >= self.links {
            return;
        }
        match Message::decode(bytes) {
            Ok(message) => self.handle(link, message, memory),
            Err(_) => self.answer_malformed(bytes),
        }
        self.run_local(memory);
    }

    /// If the header of a malformed message is readable and it was a request from a known
    /// enclave, tell the origin; never answer a malformed answer (no error ping-pong).
    fn answer_malformed(&mut self, bytes: &[u8]) {
        if bytes.len() < HEADER_LEN || bytes[0] != wire::VERSION || bytes[1] >= wire::FIRST_ANSWER_KIND || self.id == 0 {
            return;
        }
        let request = wire::request_id(bytes).unwrap_or(0);
        let origin = u32::from_le_bytes(bytes[16..20].try_into().unwrap_or([0; 4]));
        if origin == 0 || origin > crate::ids::MAX_ENCLAVE_ID || origin == self.id {
            return;
        }
        self.send(Message::new(request, self.id, origin, Body::Failed { error: Error::Malformed }));
    }

    fn handle(&mut self, link: LinkId, message: Message, memory: &mut dyn LocalMemory) {
        match message.body {
            Body::PingNameServer => {
                if self.id != 0 {
                    self.outbox.push((link, Message::new(0, 0, 0, Body::PongNameServer)));
                }
            }
            Body::PongNameServer => {
                if self.name_server.is_none() && self.towards_name_server.is_none() {
                    self.towards_name_server = Some(link);
                    if self.id == 0 {
                        self.last_discovery = Some(self.now);
                        self.ask_for_id(link);
                    }
                }
            }
            Body::EnclaveIdRequest { token } => {
                if Some(link) == self.towards_name_server {
                    return; // upstream never asks us: a loop or a confused peer
                }
                if let Some(ns) = self.name_server.as_mut() {
                    if let Ok(enclave) = ns.allocate_enclave() {
                        // A reused id starts its request ids afresh: answers cached for the
                        // enclave that had it before must not answer the new one.
                        self.forget_replies(enclave);
                        self.routes.insert(enclave, link);
                        self.outbox.push((link, Message::new(0, 0, 0, Body::EnclaveIdResponse { token, enclave })));
                    }
                } else if let (Some(up), true) = (self.towards_name_server, self.id != 0) {
                    let ours = self.fresh_token();
                    self.forwarded.insert(ours, (link, token));
                    self.outbox.push((up, Message::new(0, 0, 0, Body::EnclaveIdRequest { token: ours })));
                }
            }
            Body::EnclaveIdResponse { token, enclave } => {
                if Some(link) != self.towards_name_server {
                    return;
                }
                if self.id == 0 && self.own_token == Some(token) {
                    self.id = enclave;
                    self.own_token = None;
                } else if let Some((down, theirs)) = self.forwarded.remove(&token) {
                    self.routes.insert(enclave, down);
                    self.outbox.push((down, Message::new(0, 0, 0, Body::EnclaveIdResponse { token: theirs, enclave })));
                }
            }
            Body::EnclaveGone { enclave } => {
                // Our own id, from upstream: the hop above rejoined (its name server is gone),
                // and our id went with it.
                if self.id != 0 && enclave == self.id && self.name_server.is_none() && Some(link) == self.towards_name_server {
                    self.rejoin();
                    return;
                }
                // Only a hop on the path to that enclave may declare it gone: the notice must
                // arrive on the link our route to it uses.
                if self.id == 0 || self.routes.get(&enclave) != Some(&link) {
                    return;
                }
                self.routes.remove(&enclave);
                if let Some(ns) = self.name_server.as_mut() {
                    ns.forget_enclave(enclave);
                    self.forget_replies(enclave);
                } else if let Some(up) = self.towards_name_server {
                    self.outbox.push((up, message));
                }
            }
            _ => {
                if self.id == 0 {
                    return;
                }
                if message.header.destination == self.id {
                    // Straight in unless earlier ones wait (order kept); what it begets goes
                    // through the local queue.
                    if self.local.is_empty() {
                        self.deliver(message, memory);
                    } else {
                        self.local.push_back(message);
                    }
                    return;
                }
                let next = self.routes.get(&message.header.destination).copied().or(self.towards_name_server);
                match next {
                    // Sending it back where it came from would loop: the destination is unknown.
                    Some(next) if next != link => self.outbox.push((next, message)),
                    _ => {}
                }
            }
        }
    }

    fn send(&mut self, message: Message) {
        if message.header.destination == self.id {
            self.local.push_back(message);
            return;
        }
        let next = self.routes.get(&message.header.destination).copied().or(self.towards_name_server);
        if let Some(link) = next {
            self.outbox.push((link, message));
        }
    }

    fn run_local(&mut self, memory: &mut dyn LocalMemory) {
        // Bounded: local messages beget at most a few more (name server -> owner -> requester).
        let mut budget = 64 + 4 * self.local.len();
        while let Some(message) = self.local.pop_front() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            self.deliver(message, memory);
        }
    }

    fn deliver(&mut self, message: Message, memory: &mut dyn LocalMemory) {
        let Header { request, origin, .. } = message.header;
        if message.body.is_answer() {
            self.complete(origin, request, message.body);
            return;
        }
        match message.body {
            Body::Serve { requester, owner_process, segment, vaddr, size } => {
                if origin != NAME_SERVER_ENCLAVE {
                    return;
                }
                let answer = self.serve(owner_process, segment, vaddr, size, memory);
                match answer {
                    Ok(parts) => {
                        for body in parts {
                            self.send(Message::new(request, self.id, requester, body));
                        }
                    }
                    Err(error) => self.send(Message::new(request, self.id, requester, Body::Failed { error })),
                }
            }
            Body::Notify { owner_process, segment } => {
                if origin == NAME_SERVER_ENCLAVE && self.owned.get(&segment).is_some_and(|o| o.0 == owner_process) {
                    memory.notify(owner_process, segment);
                }
            }
            Body::Revoke { process, access } => {
                // Only the name server hands out permits, so only it may take them back.
                if origin != NAME_SERVER_ENCLAVE {
                    return;
                }
                self.granted.remove(&access);
                memory.revoke(process, access);
                self.send(Message::new(request, self.id, origin, Body::Revoked { process, access }));
            }
            body => {
                if self.name_server.is_none() {
                    self.send(Message::new(request, self.id, origin, Body::Failed { error: Error::Invalid }));
                    return;
                }
                for answer in self.name_server_answer(origin, request, body) {
                    self.send(answer);
                }
            }
        }
    }

    fn serve(&mut self, process: u64, segment: SegmentId, vaddr: u64, size: u64, memory: &mut dyn LocalMemory) -> Result<Vec<Body>, Error> {
        let &(owner, start, length) = self.owned.get(&segment).ok_or(Error::NotFound)?;
        let end = vaddr.checked_add(size).ok_or(Error::Invalid)?;
        if owner != process || vaddr < start || end > start + length {
            return Err(Error::Invalid);
        }
        let runs = memory.resolve(process, vaddr, size)?;
        let pages: u64 = runs.iter().map(|r| r.frames).sum();
        if pages != size / crate::PAGE_SIZE || !runs.iter().all(FrameRun::valid) {
            return Err(Error::Invalid);
        }
        wire::attached_parts(segment, size, &runs, None)
    }

    /// The name server's answer to a request from `origin`, repeated verbatim for a retry.
    fn name_server_answer(&mut self, origin: EnclaveId, request: u64, body: Body) -> Vec<Message> {
        if let Some(cached) = self.replies.get(origin, request) {
            return cached.clone();
        }
        let Some(ns) = self.name_server.as_mut() else { return Vec::new() };
        let me = self.id;
        let reply = |body: Body| Message::new(request, me, origin, body);
        let fail = |error: Error| Message::new(request, me, origin, Body::Failed { error });
        let caller = |process: u64| Principal { enclave: origin, process };
        let answers = match body {
            Body::Make { process, vaddr, size, uid, gid, mode, name } => {
                match ns.make(caller(process), vaddr, size, Owner { uid, gid, mode }, name) {
                    Ok(segment) => alloc::vec![reply(Body::Made { segment })],
                    Err(e) => alloc::vec![fail(e)],
                }
            }
            Body::Remove { process, segment } => match ns.remove(caller(process), segment) {
                Ok(_) => alloc::vec![reply(Body::Done)],
                Err(e) => alloc::vec![fail(e)],
            },
            Body::Get { process, segment, access, uid, groups } => {
                match ns.get(caller(process), &Credentials { uid, groups }, segment, access) {
                    Ok((access, size)) => alloc::vec![reply(Body::Granted { access, size })],
                    Err(e) => alloc::vec![fail(e)],
                }
            }
            Body::Release { process, access } => match ns.release(caller(process), access) {
                Ok(()) => alloc::vec![reply(Body::Done)],
                Err(e) => alloc::vec![fail(e)],
            },
            Body::Attach { process, access, offset, size } => match ns.attach(caller(process), access, offset, size) {
                Ok(plan) => alloc::vec![Message::new(
                    request,
                    me,
                    plan.owner.enclave,
                    Body::Serve {
                        requester: origin,
                        owner_process: plan.owner.process,
                        segment: plan.segment,
                        vaddr: plan.vaddr,
                        size: plan.size,
                    },
                )],
                Err(e) => alloc::vec![fail(e)],
            },
            Body::Detach { process, access } => match ns.detach(caller(process), access) {
                Ok(()) => alloc::vec![reply(Body::Done)],
                Err(e) => alloc::vec![fail(e)],
            },
            Body::Lookup { name } => match ns.lookup(&name) {
                Ok(segment) => alloc::vec![reply(Body::Found { segment })],
                Err(e) => alloc::vec![fail(e)],
            },
            Body::List { after } => {
                let mut listing = ns.list(after, wire::MAX_LIST_ENTRIES + 1);
                let more = listing.len() > wire::MAX_LIST_ENTRIES;
                listing.truncate(wire::MAX_LIST_ENTRIES);
                let entries =
                    listing.into_iter().map(|l| ListEntry { segment: l.segment, owner: l.owner, size: l.size, name: l.name }).collect();
                alloc::vec![reply(Body::Listed { more, entries })]
            }
            Body::Signal { process, access } => match ns.signal(caller(process), access) {
                Ok((owner, segment)) => alloc::vec![
                    Message::new(request, me, owner.enclave, Body::Notify { owner_process: owner.process, segment }),
                    reply(Body::Done),
                ],
                Err(e) => alloc::vec![fail(e)],
            },
            _ => alloc::vec![fail(Error::Invalid)],
        };
        self.replies.insert(origin, request, answers.clone());
        answers
    }

    fn complete(&mut self, from: EnclaveId, request: u64, body: Body) {
        let Some(pending) = self.pending.get_mut(&request) else {
            if request >= FIRST_UNCLAIMED_ID && self.unclaimed.len() < MAX_UNCLAIMED {
                self.unclaimed.push(Message::new(request, from, self.id, body));
            }
            return;
        };
        let result = match pending.expectation.judge(from, body) {
            Verdict::NotAnAnswer | Verdict::Part => return,
            // A part went missing or came twice: start over on the next retry.
            Verdict::PartOutOfPlace(_) => {
                pending.expectation.start_over();
                return;
            }
            Verdict::Answered(result) => result,
        };
        let expects = pending.expectation.expects;
        self.pending.remove(&request);
        if let Some(change) = expects.served_change(&result) {
            self.note_served(change);
        }
        match (expects, &result) {
            (Expects::Granted { segment }, Ok(Reply::Granted { access, .. })) => {
                self.granted.insert(*access, segment);
            }
            (Expects::Released { access }, Ok(Reply::Done)) => {
                self.granted.remove(&access);
            }
            _ => {}
        }
        self.completions.push(Completion { request, result });
    }
}
