//! The XEMEM protocol across a network of nodes: random trees of enclaves over lossy and
//! reordering links, and the node's handling of direct, malformed and forged messages.

use crate::ids::*;
use crate::nameserver::*;
use crate::node::*;
use crate::perm::*;
use crate::tests::{mode, rooted, Rng};
use crate::wire::*;
use crate::*;
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

/// Each enclave's memory: process p's page v is frame `enclave << 28 | p << 20 | v` (mod the
/// frame space), contiguous in runs of `run` pages; pages at or above `hole_from` are holes.
/// Any mix-up between enclaves, processes or offsets shows in the frame numbers.
struct ModelMemory {
    enclave: EnclaveId,
    run: u64,
    notified: Vec<(u64, SegmentId)>,
    revoked: Vec<(u64, AccessId)>,
}

const HOLE_FROM: u64 = 0x4000_0000;

fn expected_frame(enclave: EnclaveId, process: u64, page: u64) -> u64 {
    ((enclave as u64) << 28 | (process & 0xff) << 20 | (page & 0xfffff)) % MAX_FRAME
}

impl ModelMemory {
    fn expected(enclave: EnclaveId, run: u64, process: u64, vaddr: u64, size: u64) -> Vec<FrameRun> {
        let mut runs: Vec<FrameRun> = Vec::new();
        for page in vaddr / PAGE_SIZE..(vaddr + size) / PAGE_SIZE {
            let hole = page * PAGE_SIZE >= HOLE_FROM;
            let frame = expected_frame(enclave, process, page);
            let contiguous = page % run != 0;
            match runs.last_mut() {
                Some(last) if hole && last.first.is_none() => last.frames += 1,
                Some(last) if !hole && contiguous && last.first.is_some_and(|f| f + last.frames == frame) => last.frames += 1,
                _ => runs.push(FrameRun { first: if hole { None } else { Some(frame) }, frames: 1 }),
            }
        }
        runs
    }
}

impl LocalMemory for ModelMemory {
    fn resolve(&mut self, process: u64, vaddr: u64, size: u64) -> Result<Vec<FrameRun>, Error> {
        Ok(Self::expected(self.enclave, self.run, process, vaddr, size))
    }
    fn notify(&mut self, process: u64, segment: SegmentId) {
        self.notified.push((process, segment));
    }
    fn revoke(&mut self, process: u64, access: AccessId) {
        self.revoked.push((process, access));
    }
}

pub(crate) struct Net {
    pub(crate) nodes: Vec<Node>,
    memory: Vec<ModelMemory>,
    /// link endpoints: for node n, link l leads to (node, link at that node).
    peers: Vec<Vec<(usize, LinkId)>>,
    in_flight: VecDeque<(usize, LinkId, Vec<u8>)>,
    rng: Rng,
    drop_per_thousand: u64,
    reorder: bool,
    now: u64,
}

impl Net {
    /// A random tree of `n` enclaves; the name server sits at a random one of them.
    pub(crate) fn tree(n: usize, seed: u64, drop_per_thousand: u64, reorder: bool) -> Net {
        let mut rng = Rng::new(seed | 1);
        let ns_at = rng.below(n as u64) as usize;
        let mut peers: Vec<Vec<(usize, LinkId)>> = vec![Vec::new(); n];
        for child in 1..n {
            let parent = rng.below(child as u64) as usize;
            let child_link = peers[child].len() as LinkId;
            let parent_link = peers[parent].len() as LinkId;
            peers[child].push((parent, parent_link));
            peers[parent].push((child, child_link));
        }
        let timing = Timing { retry_after: 200, attempts: 8 };
        let nodes = (0..n).map(|i| Node::new(peers[i].len() as u32, (i == ns_at).then(|| NameServer::new(seed)), timing)).collect();
        let memory =
            (0..n).map(|_| ModelMemory { enclave: 0, run: 1 + rng.below(64), notified: Vec::new(), revoked: Vec::new() }).collect();
        Net { nodes, memory, peers, in_flight: VecDeque::new(), rng, drop_per_thousand, reorder, now: 0 }
    }

    /// A path of `n` enclaves, the name server (instance `seed`) at `name_server_at`; each
    /// enclave's memory a run of its own (enclave `i`'s frames start at `1 + i`).
    fn chain(n: usize, name_server_at: usize, timing: Timing, seed: u64) -> Net {
        let mut peers: Vec<Vec<(usize, LinkId)>> = vec![Vec::new(); n];
        for i in 1..n {
            let a = peers[i - 1].len() as LinkId;
            let b = peers[i].len() as LinkId;
            peers[i - 1].push((i, b));
            peers[i].push((i - 1, a));
        }
        let nodes =
            (0..n).map(|i| Node::new(peers[i].len() as u32, (i == name_server_at).then(|| NameServer::new(seed)), timing)).collect();
        let memory = (0..n).map(|i| ModelMemory { enclave: 0, run: 1 + i as u64, notified: Vec::new(), revoked: Vec::new() }).collect();
        Net { nodes, memory, peers, in_flight: VecDeque::new(), rng: Rng::new(seed | 1), drop_per_thousand: 0, reorder: false, now: 0 }
    }

    fn collect(&mut self, node: usize) {
        for (link, message) in self.nodes[node].outbox() {
            let bytes = message.to_bytes().expect("a node only sends encodable messages");
            let (peer, peer_link) = self.peers[node][link as usize];
            self.in_flight.push_back((peer, peer_link, bytes));
        }
    }

    /// Delivers (dropping and reordering as configured) until quiet, then advances time.
    fn step(&mut self) {
        let mut budget = 200_000;
        while let Some(item) = if self.reorder && !self.in_flight.is_empty() {
            let i = self.rng.below(self.in_flight.len() as u64) as usize;
            self.in_flight.swap_remove_back(i)
        } else {
            self.in_flight.pop_front()
        } {
            budget -= 1;
            assert!(budget > 0, "message storm");
            let (node, link, bytes) = item;
            if self.rng.chance(self.drop_per_thousand) {
                continue;
            }
            self.nodes[node].receive(link, &bytes, &mut self.memory[node]);
            self.memory[node].enclave = self.nodes[node].id().unwrap_or(0);
            self.collect(node);
        }
        self.now += 50;
        for node in 0..self.nodes.len() {
            self.nodes[node].tick(self.now, &mut self.memory[node]);
            self.collect(node);
        }
    }

    /// A settled lossless tree of `n` enclaves and the first of them the name server is not in,
    /// with that one's enclave id: the usual client of a test.
    fn settled_with_client(n: usize, seed: u64) -> (Net, usize, EnclaveId) {
        let mut net = Net::tree(n, seed, 0, false);
        net.settle_ids();
        let client = (0..n).find(|&i| net.nodes[i].name_server().is_none()).unwrap();
        let id = net.nodes[client].id().unwrap();
        (net, client, id)
    }

    pub(crate) fn settle_ids(&mut self) {
        for _ in 0..2000 {
            if self.nodes.iter().all(|n| n.id().is_some()) {
                for (memory, node) in self.memory.iter_mut().zip(&self.nodes) {
                    memory.enclave = node.id().unwrap_or(0);
                }
                return;
            }
            self.step();
        }
        panic!("not every enclave got an id");
    }

    /// A segment of `process`'s whole address space at `node`, root's with mode 0600.
    fn make_whole_space(&mut self, node: usize, process: u64) -> SegmentId {
        let owner = Owner { uid: 0, gid: 0, mode: 0o600 };
        match self.call(node, Request::Make { process, vaddr: 0, size: MAXADDR_SIZE, owner, name: None }) {
            Ok(Reply::Made(segment)) => segment,
            other => panic!("make at {node}: {other:?}"),
        }
    }

    /// A read-write permit for root's `process` at `node` to `segment`.
    fn get_read_write(&mut self, node: usize, process: u64, segment: SegmentId) -> AccessId {
        match self.call(node, Request::Get { process, segment, access: ACCESS_READ_WRITE, credentials: rooted() }) {
            Ok(Reply::Granted { access, .. }) => access,
            other => panic!("get of {segment:?} at {node}: {other:?}"),
        }
    }

    /// Runs one request at `node` to completion (or to its give-up).
    pub(crate) fn call(&mut self, node: usize, request: Request) -> Result<Reply, Error> {
        let id = self.nodes[node].request(request, &mut self.memory[node])?;
        self.collect(node);
        for _ in 0..5000 {
            // Completions of earlier, abandoned requests are dropped here.
            if let Some(c) = self.nodes[node].completions().into_iter().find(|c| c.request == id) {
                return c.result;
            }
            self.step();
        }
        panic!("request {id} at node {node} never completed nor gave up");
    }
}

impl Net {
    /// Sends `message` to `node` over its link towards the name server, as if from that hop.
    fn deliver_from_upstream(&mut self, node: usize, message: Message) {
        let link = self.nodes[node].link_towards_name_server().expect("the node has found the name server");
        self.in_flight.push_back((node, link, message.to_bytes().unwrap()));
    }

    /// Sends `message`, from `node`, to its next hop towards the name server.
    fn send_upstream(&mut self, node: usize, message: Message) {
        let link = self.nodes[node].link_towards_name_server().expect("the node has found the name server");
        let (peer, peer_link) = self.peers[node][link as usize];
        self.in_flight.push_back((peer, peer_link, message.to_bytes().unwrap()));
    }

    /// Runs `request` at `node` as its kernel does around the node (`DirectRequest`, the
    /// answers' changes to what it serves noted), on these lossless, in-order links.
    fn call_direct(&mut self, node: usize, sequence: u64, request: Request) -> Result<Reply, Error> {
        let origin = self.nodes[node].id().unwrap();
        let (mut direct, message) = DirectRequest::new(sequence, origin, request)?;
        self.send_upstream(node, message);
        for _ in 0..20 {
            self.step();
            let answers: Vec<Message> = self.nodes[node].drain_unclaimed().collect();
            for Message { header, body } in answers {
                assert_eq!(header.request, direct.id());
                if let Some(result) = direct.answer(header.origin, body) {
                    if let Some(change) = direct.served_change(&result) {
                        self.nodes[node].note_served(change);
                    }
                    return result;
                }
            }
        }
        panic!("direct request {sequence} at node {node} got no answer");
    }
}

fn check_tree(n: usize, seed: u64, drop_per_thousand: u64, reorder: bool, pairs: usize) {
    let mut net = Net::tree(n, seed, drop_per_thousand, reorder);
    net.settle_ids();
    let ids: Vec<EnclaveId> = net.nodes.iter().map(|n| n.id().unwrap()).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), n, "enclave ids are unique: {ids:?}");
    let lossless = drop_per_thousand == 0;
    let mut rng = Rng::new(seed ^ 0xabcdef);
    let mut completed = 0;
    for round in 0..pairs {
        let owner = rng.below(n as u64) as usize;
        let attacher = rng.below(n as u64) as usize;
        let process = 1 + rng.below(200);
        let vaddr = rng.below(0x1000) * PAGE_SIZE;
        let pages = 1 + rng.below(300);
        let name = Name::new(std::format!("seg-{seed:x}-{round}").as_bytes()).unwrap();
        let made = net.call(
            owner,
            Request::Make {
                process,
                vaddr,
                size: pages * PAGE_SIZE,
                owner: Owner { uid: 1000, gid: 100, mode: 0o600 },
                name: Some(name.clone()),
            },
        );
        let segment = match made {
            Ok(Reply::Made(s)) => s,
            Err(Error::Unreachable) if !lossless => continue,
            other => panic!("make: {other:?}"),
        };
        assert_eq!(segment.enclave(), ids[owner], "a segid names its owner enclave");
        match net.call(attacher, Request::Lookup { name: name.clone() }) {
            Ok(Reply::Found(s)) => assert_eq!(s, segment),
            Err(Error::Unreachable) if !lossless => {}
            other => panic!("lookup: {other:?}"),
        }
        let who = Credentials { uid: 1000, groups: vec![100] };
        let access = match net.call(attacher, Request::Get { process: 7, segment, access: ACCESS_READ_WRITE, credentials: who.clone() }) {
            Ok(Reply::Granted { access, size }) => {
                assert_eq!(size, pages * PAGE_SIZE);
                access
            }
            Err(Error::Unreachable) if !lossless => continue,
            other => panic!("get: {other:?}"),
        };
        // Someone else's credentials are refused.
        if lossless {
            let stranger = Credentials { uid: 4242, groups: vec![4242] };
            assert_eq!(
                net.call(attacher, Request::Get { process: 7, segment, access: ACCESS_READ_ONLY, credentials: stranger }),
                Err(Error::Denied)
            );
        }
        let offset_pages = rng.below(pages);
        let attach_pages = 1 + rng.below(pages - offset_pages);
        match net.call(attacher, Request::Attach { process: 7, access, offset: offset_pages * PAGE_SIZE, size: attach_pages * PAGE_SIZE }) {
            Ok(Reply::Attached { segment: s, runs, valid_while: None }) => {
                assert_eq!(s, segment);
                let expected = ModelMemory::expected(
                    ids[owner],
                    net.memory[owner].run,
                    process,
                    vaddr + offset_pages * PAGE_SIZE,
                    attach_pages * PAGE_SIZE,
                );
                assert_eq!(runs, expected, "the attach maps exactly the owner's frames");
                completed += 1;
            }
            Err(Error::Unreachable) if !lossless => {}
            other => panic!("attach: {other:?}"),
        }
        // Attaching beyond the segment is an argument error, not a mapping.
        if lossless {
            assert_eq!(
                net.call(attacher, Request::Attach { process: 7, access, offset: pages * PAGE_SIZE, size: PAGE_SIZE }),
                Err(Error::Invalid)
            );
            assert_eq!(net.call(attacher, Request::Signal { process: 7, access }), Ok(Reply::Done));
            net.step();
            assert!(net.memory[owner].notified.contains(&(process, segment)), "the owner got the signal");
        }
        for request in [Request::Detach { process: 7, access }, Request::Release { process: 7, access }] {
            match net.call(attacher, request) {
                Ok(Reply::Done) => {}
                Err(Error::Unreachable) if !lossless => {}
                // A retried release whose first answer was lost is answered from the cache.
                other => panic!("detach/release: {other:?}"),
            }
        }
        if lossless {
            // Only the owner process may remove.
            assert_eq!(net.call(owner, Request::Remove { process: process + 1, segment }), Err(Error::Denied));
        }
        match net.call(owner, Request::Remove { process, segment }) {
            Ok(Reply::Done) => {
                if lossless {
                    assert_eq!(net.call(owner, Request::Remove { process, segment }), Err(Error::NotFound));
                    assert_eq!(
                        net.call(attacher, Request::Attach { process: 7, access, offset: 0, size: PAGE_SIZE }),
                        Err(Error::NotFound)
                    );
                }
            }
            Err(Error::Unreachable) if !lossless => {}
            other => panic!("remove: {other:?}"),
        }
    }
    assert!(completed > 0, "some attaches went through");
    if lossless {
        assert_eq!(completed, pairs);
        let ns = net.nodes.iter().find_map(|n| n.name_server()).unwrap();
        assert_eq!(ns.segment_count(), 0);
        assert_eq!(ns.permit_count(), 0);
    }
}

#[test]
fn random_trees_every_pair_makes_gets_attaches_detaches_removes() {
    for (i, n) in [1usize, 2, 3, 5, 8, 17, 33, 64].into_iter().enumerate() {
        check_tree(n, 0x1000 + i as u64, 0, false, 24);
    }
}

#[test]
fn random_trees_with_reordering_links() {
    for (i, n) in [4usize, 16, 64].into_iter().enumerate() {
        check_tree(n, 0x2000 + i as u64, 0, true, 24);
    }
}

#[test]
fn random_trees_with_lossy_reordering_links_never_map_wrong_frames() {
    for (i, n) in [6usize, 24, 64].into_iter().enumerate() {
        check_tree(n, 0x3000 + i as u64, 30, true, 24);
    }
}

#[test]
#[allow(clippy::needless_range_loop)] // owner indexes nodes, memory and ids alike
fn every_pair_in_a_deep_chain() {
    // A path of 12 enclaves: the longest route in a tree of this size; all 144 ordered pairs.
    let n = 12;
    let mut net = Net::chain(n, n / 2, Timing { retry_after: 200, attempts: 8 }, 3);
    net.settle_ids();
    let ids: Vec<EnclaveId> = net.nodes.iter().map(|n| n.id().unwrap()).collect();
    for owner in 0..n {
        let segment = net.make_whole_space(owner, 1);
        for attacher in 0..n {
            let access = net.get_read_write(attacher, 2, segment);
            // Whole-address-space segment: the offset is the owner's virtual address, and
            // a range reaching past HOLE_FROM comes back with a hole.
            let offset = HOLE_FROM - 4 * PAGE_SIZE;
            let Ok(Reply::Attached { runs, .. }) = net.call(attacher, Request::Attach { process: 2, access, offset, size: 8 * PAGE_SIZE })
            else {
                panic!("attach")
            };
            assert_eq!(runs, ModelMemory::expected(ids[owner], net.memory[owner].run, 1, offset, 8 * PAGE_SIZE));
            assert_eq!(runs.last().unwrap().first, None);
            assert_eq!(net.call(attacher, Request::Release { process: 2, access }), Ok(Reply::Done));
        }
        assert_eq!(net.call(owner, Request::Remove { process: 1, segment }), Ok(Reply::Done));
    }
}

#[test]
fn request_ids_and_answers_are_told_from_the_header_alone() {
    let id = (1 << 63) | 5;
    let mut bytes =
        Message::new(id, 3, NAME_SERVER_ENCLAVE, Body::Detach { process: 1, access: AccessId::new(3, 1).unwrap() }).to_bytes().unwrap();
    assert_eq!(request_id(&bytes), Some(id));
    bytes.truncate(HEADER_LEN);
    assert_eq!(request_id(&bytes), Some(id), "the body is not needed");
    assert_eq!(request_id(&bytes[..15]), None, "too short for the id");
    assert_eq!(answered_request(&bytes), None, "a request, not an answer");
    let done = Message::new(id, NAME_SERVER_ENCLAVE, 3, Body::Done).to_bytes().unwrap();
    assert_eq!(answered_request(&done), Some(id));
}

#[test]
fn an_answer_to_a_request_sent_around_the_node_is_handed_out_unclaimed() {
    // The enclave's kernel asks the name server directly (an id the node never uses) to attach
    // a segment of its own enclave: the node serves it and the answer comes back through it.
    let (mut net, client, id) = Net::settled_with_client(2, 7);
    let made = net.call(client, Request::Make { process: 4, vaddr: 0x10000, size: 0x4000, owner: mode(0o600), name: None });
    let Ok(Reply::Made(segment)) = made else { panic!("make: {made:?}") };
    let credentials = Credentials { uid: 1000, groups: vec![100] };
    let granted = net.call(client, Request::Get { process: 5, segment, access: ACCESS_READ_WRITE, credentials });
    let Ok(Reply::Granted { access, .. }) = granted else { panic!("get: {granted:?}") };
    let request = FIRST_UNCLAIMED_ID + 3;
    let attach = Request::Attach { process: 5, access, offset: 0x1000, size: 0x2000 }.into_body().unwrap();
    net.send_upstream(client, Message::new(request, id, NAME_SERVER_ENCLAVE, attach));
    let mut answers = Vec::new();
    for _ in 0..20 {
        net.step();
        answers.extend(net.nodes[client].drain_unclaimed());
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].header.request, request);
    let Body::Attached(AttachedPart { segment: answered, size, ref runs, .. }) = answers[0].body else { panic!("{:?}", answers[0].body) };
    assert_eq!((answered, size), (segment, 0x2000));
    assert_eq!(*runs, ModelMemory::expected(id, net.memory[client].run, 4, 0x11000, 0x2000));
    assert!(net.nodes[client].completions().is_empty(), "not the node's own request");
}

#[test]
fn a_direct_attach_takes_only_its_own_answer_and_assembles_its_parts() {
    let segment = SegmentId::new(7, 3).unwrap();
    let access = AccessId::new(NAME_SERVER_ENCLAVE, 9).unwrap();
    let size = 5 * PAGE_SIZE;
    let (mut request, message) = DirectRequest::attach(4, 2, 11, access, segment, 0, size).unwrap();
    assert_eq!(request.id(), FIRST_UNCLAIMED_ID | 4);
    assert_eq!(message.header, Header { request: request.id(), origin: 2, destination: NAME_SERVER_ENCLAVE });
    assert_eq!(message.body, Body::Attach { process: 11, access, offset: 0, size });
    let part =
        |first_run, runs: Vec<FrameRun>| Body::Attached(AttachedPart { segment, size, first_run, total_runs: 3, runs, valid_while: None });
    let first = vec![FrameRun { first: Some(100), frames: 2 }, FrameRun { first: None, frames: 1 }];
    let last = vec![FrameRun { first: Some(300), frames: 2 }];
    // Not answers to it: another enclave, another segment or size, another kind.
    assert_eq!(request.answer(5, part(0, first.clone())), None);
    let other = SegmentId::new(7, 4).unwrap();
    assert_eq!(
        request.answer(
            1,
            Body::Attached(AttachedPart { segment: other, size, first_run: 0, total_runs: 3, runs: first.clone(), valid_while: None })
        ),
        None
    );
    assert_eq!(
        request.answer(
            1,
            Body::Attached(AttachedPart {
                segment,
                size: size + PAGE_SIZE,
                first_run: 0,
                total_runs: 3,
                runs: first.clone(),
                valid_while: None
            })
        ),
        None
    );
    assert_eq!(request.answer(1, Body::Done), None);
    // The owner (enclave 7) may answer as well as the name server; two parts make the runs.
    assert_eq!(request.answer(7, part(0, first.clone())), None);
    let whole = [first.clone(), last.clone()].concat();
    assert_eq!(request.answer(1, part(2, last.clone())), Some(Ok(Reply::Attached { segment, runs: whole, valid_while: None })));
    // A part out of place fails it (the channel neither loses nor reorders).
    let (mut request, _) = DirectRequest::attach(5, 2, 11, access, segment, 0, size).unwrap();
    assert_eq!(request.answer(1, part(2, last)), Some(Err(Error::Malformed)));
    // The name server's refusal is the result.
    let (mut request, _) = DirectRequest::attach(6, 2, 11, access, segment, 0, size).unwrap();
    assert_eq!(request.answer(1, Body::Failed { error: Error::Denied }), Some(Err(Error::Denied)));
    // Checked before it is sent.
    assert_eq!(DirectRequest::attach(7, 2, 11, access, segment, 1, size).err(), Some(Error::Invalid));
}

#[test]
fn other_direct_requests_take_their_kind_of_answer_from_the_name_server_alone() {
    let access = AccessId::new(NAME_SERVER_ENCLAVE, 9).unwrap();
    let segment = SegmentId::new(7, 3).unwrap();
    let (mut request, message) = DirectRequest::new(1, 2, Request::Detach { process: 11, access }).unwrap();
    assert_eq!(message.body, Body::Detach { process: 11, access });
    assert_eq!(request.answer(3, Body::Done), None, "only the name server answers a detach");
    assert_eq!(request.answer(1, Body::Granted { access, size: PAGE_SIZE }), None);
    assert_eq!(request.answer(1, Body::Done), Some(Ok(Reply::Done)));
    let credentials = Credentials { uid: 1000, groups: vec![100] };
    let (mut get, _) = DirectRequest::new(2, 2, Request::Get { process: 11, segment, access: ACCESS_READ_WRITE, credentials }).unwrap();
    assert_eq!(get.answer(1, Body::Done), None);
    assert_eq!(get.answer(7, Body::Granted { access, size: PAGE_SIZE }), None, "the owner does not grant");
    assert_eq!(get.answer(1, Body::Granted { access, size: PAGE_SIZE }), Some(Ok(Reply::Granted { access, size: PAGE_SIZE })));
    let name = Name::new(b"field").unwrap();
    let (mut lookup, _) = DirectRequest::new(3, 2, Request::Lookup { name }).unwrap();
    assert_eq!(lookup.answer(1, Body::Found { segment }), Some(Ok(Reply::Found(segment))));
    let (mut list, _) = DirectRequest::new(4, 2, Request::List { after: 0 }).unwrap();
    assert_eq!(list.answer(1, Body::Listed { more: false, entries: vec![] }), Some(Ok(Reply::Listed { more: false, entries: vec![] })));
    // A make takes a segment of the asking enclave only, and is checked before it is sent.
    let make = Request::Make { process: 11, vaddr: 0x1000, size: 0x1000, owner: mode(0o600), name: None };
    let (mut made, _) = DirectRequest::new(5, 2, make.clone()).unwrap();
    assert_eq!(made.answer(1, Body::Made { segment }), None, "a segment of enclave 7");
    let ours = SegmentId::new(2, 8).unwrap();
    assert_eq!(made.answer(1, Body::Made { segment: ours }), Some(Ok(Reply::Made(ours))));
    let unaligned = Request::Make { process: 11, vaddr: 0x1001, size: 0x1000, owner: mode(0o600), name: None };
    assert_eq!(DirectRequest::new(6, 2, unaligned).err(), Some(Error::Invalid));
    let (mut removed, _) = DirectRequest::new(7, 2, Request::Remove { process: 11, segment: ours }).unwrap();
    assert_eq!(removed.answer(1, Body::Made { segment: ours }), None);
    assert_eq!(removed.answer(1, Body::Done), Some(Ok(Reply::Done)));
    // What the answers change in the segments the asking node serves: a segment removed, or
    // found gone already, is not served any more; a refused remove changes nothing.
    assert_eq!(
        made.served_change(&Ok(Reply::Made(ours))),
        Some(ServedChange::Made { segment: ours, process: 11, vaddr: 0x1000, length: 0x1000 })
    );
    assert_eq!(removed.served_change(&Ok(Reply::Done)), Some(ServedChange::Removed { segment: ours }));
    assert_eq!(removed.served_change(&Err(Error::NotFound)), Some(ServedChange::Removed { segment: ours }));
    assert_eq!(removed.served_change(&Err(Error::Denied)), None);
    // An attach needs its permit's segment.
    assert_eq!(DirectRequest::new(8, 2, Request::Attach { process: 11, access, offset: 0, size: 0x1000 }).err(), Some(Error::Invalid));
}

#[test]
fn the_node_serves_segments_made_directly_until_they_are_removed_directly() {
    let (mut net, client, id) = Net::settled_with_client(3, 11);
    let other = (0..3).find(|&i| i != client).unwrap();
    let other_id = net.nodes[other].id().unwrap();
    let make = Request::Make { process: 4, vaddr: 0x10000, size: 0x4000, owner: mode(0o666), name: None };
    let made = net.call_direct(client, 1, make);
    let Ok(Reply::Made(segment)) = made else { panic!("make: {made:?}") };
    assert_eq!(segment.enclave(), id);
    // Another enclave attaches it through the name server: the client's node serves the frames.
    let credentials = Credentials { uid: 1000, groups: vec![100] };
    let granted = net.call(other, Request::Get { process: 9, segment, access: ACCESS_READ_WRITE, credentials });
    let Ok(Reply::Granted { access, .. }) = granted else { panic!("get: {granted:?}") };
    let runs = ModelMemory::expected(id, net.memory[client].run, 4, 0x11000, 0x2000);
    assert_eq!(
        net.call(other, Request::Attach { process: 9, access, offset: 0x1000, size: 0x2000 }),
        Ok(Reply::Attached { segment, runs, valid_while: None })
    );
    assert_eq!(net.call(other, Request::Detach { process: 9, access }), Ok(Reply::Done));
    assert_eq!(net.call_direct(client, 2, Request::Remove { process: 4, segment }), Ok(Reply::Done));
    // Removed: the node no longer serves it, even when asked as the name server would.
    let serve = Body::Serve { requester: other_id, owner_process: 4, segment, vaddr: 0x10000, size: 0x1000 };
    net.deliver_from_upstream(client, Message::new(FIRST_UNCLAIMED_ID | 50, NAME_SERVER_ENCLAVE, id, serve));
    let mut answers = Vec::new();
    for _ in 0..20 {
        net.step();
        answers.extend(net.nodes[other].drain_unclaimed());
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].body, Body::Failed { error: Error::NotFound });
}

#[test]
fn a_malformed_request_is_answered_with_an_error_and_the_node_keeps_working() {
    let mut net = Net::tree(3, 99, 0, false);
    net.settle_ids();
    let ns_node = (0..3).find(|&i| net.nodes[i].name_server().is_some()).unwrap();
    let client = (0..3).find(|&i| i != ns_node).unwrap();
    let client_id = net.nodes[client].id().unwrap();
    let mut bytes = Message::new(77, client_id, NAME_SERVER_ENCLAVE, Body::List { after: 0 }).to_bytes().unwrap();
    bytes.push(0xee); // trailing garbage, body length now wrong
    let link = net.nodes[ns_node].route(client_id).unwrap();
    net.nodes[ns_node].receive(link, &bytes, &mut net.memory[ns_node]);
    let out = net.nodes[ns_node].outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.body, Body::Failed { error: Error::Malformed });
    assert_eq!(out[0].1.header.request, 77);
    assert_eq!(net.call(client, Request::List { after: 0 }), Ok(Reply::Listed { more: false, entries: vec![] }));
}

#[test]
fn answers_from_the_wrong_enclave_or_of_the_wrong_kind_are_ignored() {
    let (mut net, client, id) = Net::settled_with_client(3, 5);
    let request = net.nodes[client].request(Request::List { after: 0 }, &mut net.memory[client]).unwrap();
    let _ = net.nodes[client].outbox(); // lose the request
    let link = net.nodes[client].link_towards_name_server().unwrap();
    let seg = SegmentId::new(1, 1).unwrap();
    for forged in [
        Message::new(request, 9, id, Body::Listed { more: false, entries: vec![] }), // not the name server
        Message::new(request, 1, id, Body::Found { segment: seg }),                  // wrong kind
        Message::new(request + 1, 1, id, Body::Listed { more: false, entries: vec![] }), // unknown request
    ] {
        net.nodes[client].receive(link, &forged.to_bytes().unwrap(), &mut net.memory[client]);
        assert!(net.nodes[client].completions().is_empty(), "{forged:?}");
    }
    assert_eq!(net.nodes[client].pending_requests(), 1);
}

#[test]
fn a_lost_enclave_takes_its_segments_and_permits_and_a_stranger_cannot_declare_it_gone() {
    // A chain 0 - 1 - 2 - 3 with the name server at 0; enclave 3 owns a segment, 1 holds a permit.
    let n = 4;
    let mut net = Net::chain(n, 0, Timing { retry_after: 200, attempts: 4 }, 4);
    net.settle_ids();
    let gone_id = net.nodes[3].id().unwrap();
    let Ok(Reply::Made(segment)) = net.call(
        3,
        Request::Make {
            process: 1,
            vaddr: 0,
            size: 16 * PAGE_SIZE,
            owner: Owner { uid: 0, gid: 0, mode: 0o600 },
            name: Some(Name::new(b"leaf").unwrap()),
        },
    ) else {
        panic!("make")
    };
    let Ok(Reply::Granted { access, .. }) =
        net.call(1, Request::Get { process: 5, segment, access: ACCESS_READ_WRITE, credentials: rooted() })
    else {
        panic!("get")
    };
    // A forged notice: enclave 3 claims that enclave 1 is gone. Enclave 2 does not reach 1
    // through its link to 3, so it drops the notice.
    let forged = Message::new(0, 3, NAME_SERVER_ENCLAVE, Body::EnclaveGone { enclave: net.nodes[1].id().unwrap() });
    let link_to_3 = net.nodes[2].route(gone_id).unwrap();
    net.nodes[2].receive(link_to_3, &forged.to_bytes().unwrap(), &mut net.memory[2]);
    net.collect(2);
    net.step();
    assert_eq!(net.nodes[0].name_server().unwrap().permit_count(), 1, "the forged notice changed nothing");
    // Enclave 2 loses its link to 3.
    net.nodes[2].link_down(link_to_3, &mut net.memory[2]);
    net.collect(2);
    net.step();
    let ns = net.nodes[0].name_server().unwrap();
    assert_eq!(ns.segment_count(), 0, "the lost enclave's segments are gone");
    assert_eq!(ns.permit_count(), 0, "and so are the permits on them");
    assert_eq!(net.call(1, Request::Lookup { name: Name::new(b"leaf").unwrap() }), Err(Error::NotFound));
    assert_eq!(net.call(1, Request::Attach { process: 5, access, offset: 0, size: PAGE_SIZE }), Err(Error::NotFound));
    assert_eq!(net.nodes[2].route(gone_id), None);
}

#[test]
fn every_ordered_pair_of_a_random_64_enclave_tree() {
    let n = 64;
    let mut net = Net::tree(n, 0x6464, 0, false);
    net.settle_ids();
    let ids: Vec<EnclaveId> = net.nodes.iter().map(|n| n.id().unwrap()).collect();
    let mut segments = Vec::new();
    for owner in 0..n {
        segments.push(net.make_whole_space(owner, 3));
    }
    for (owner, &segment) in segments.iter().enumerate() {
        for attacher in 0..n {
            let access = net.get_read_write(attacher, 4, segment);
            let offset = (attacher as u64 + 1) * 64 * PAGE_SIZE;
            let Ok(Reply::Attached { runs, .. }) = net.call(attacher, Request::Attach { process: 4, access, offset, size: 16 * PAGE_SIZE })
            else {
                panic!("attach {owner} -> {attacher}")
            };
            assert_eq!(runs, ModelMemory::expected(ids[owner], net.memory[owner].run, 3, offset, 16 * PAGE_SIZE));
            assert_eq!(net.call(attacher, Request::Detach { process: 4, access }), Ok(Reply::Done));
            assert_eq!(net.call(attacher, Request::Release { process: 4, access }), Ok(Reply::Done));
        }
        assert_eq!(net.call(owner, Request::Remove { process: 3, segment }), Ok(Reply::Done));
    }
    let ns = net.nodes.iter().find_map(|n| n.name_server()).unwrap();
    assert_eq!((ns.segment_count(), ns.permit_count()), (0, 0));
}

#[test]
fn a_gone_enclave_s_cached_answers_are_dropped_so_a_reused_id_starts_clean() {
    // The name server keeps answers per (origin, request id) for retries. An enclave id is
    // reused once freed (after the allocator wraps), and its new holder numbers its requests
    // from 1 again: the old holder's cached answers must go when it does.
    let mut net = Net::tree(2, 3, 0, false);
    let ns_node = (0..2).find(|&i| net.nodes[i].name_server().is_some()).unwrap();
    let other = 1 - ns_node;
    net.settle_ids();
    let id = net.nodes[other].id().unwrap();
    let owner = Owner { uid: 0, gid: 0, mode: 0o600 };
    assert!(matches!(net.call(other, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }), Ok(Reply::Made(_))));
    assert_eq!(net.nodes[ns_node].cached_answers_for(id), 1);
    let link = net.nodes[ns_node].route(id).unwrap();
    net.nodes[ns_node].link_down(link, &mut net.memory[ns_node]);
    assert_eq!(net.nodes[ns_node].cached_answers_for(id), 0);
    assert_eq!(net.nodes[ns_node].name_server().unwrap().segment_count(), 0);
}

#[test]
fn a_revoke_from_the_name_server_unmaps_and_is_acknowledged_and_a_forged_one_is_ignored() {
    let (mut net, holder, id) = Net::settled_with_client(6, 21);
    let up = net.nodes[holder].link_towards_name_server().unwrap();
    let access = AccessId::new(NAME_SERVER_ENCLAVE, 0x6000_0001).unwrap();
    let forged = Message::new(5, 3, id, Body::Revoke { process: 7, access });
    net.nodes[holder].receive(up, &forged.to_bytes().unwrap(), &mut net.memory[holder]);
    assert!(net.memory[holder].revoked.is_empty(), "only the name server may revoke");
    assert!(net.nodes[holder].outbox().is_empty());
    let revoke = Message::new(77, NAME_SERVER_ENCLAVE, id, Body::Revoke { process: 7, access });
    net.nodes[holder].receive(up, &revoke.to_bytes().unwrap(), &mut net.memory[holder]);
    assert_eq!(net.memory[holder].revoked, vec![(7, access)]);
    let out = net.nodes[holder].outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, up, "the acknowledgement goes back towards the name server");
    assert_eq!(out[0].1, Message::new(77, id, NAME_SERVER_ENCLAVE, Body::Revoked { process: 7, access }));
    // A permit the node does not hold (never granted, or revoked) cannot attach: no segment's
    // frames could answer it, so it fails at once.
    let attach = Request::Attach { process: 7, access, offset: 0, size: PAGE_SIZE };
    assert_eq!(net.nodes[holder].request(attach, &mut net.memory[holder]), Err(Error::NotFound));
    assert_eq!(net.nodes[holder].pending_requests(), 0);
}

#[test]
fn ids_from_before_a_name_server_restart_are_not_found_after_it() {
    // An enclave keeps a segid and an apid across a restart of its name server; the new
    // instance hands out its own and refuses the old ones instead of finding its new ones.
    let mut net = Net::tree(2, 5, 0, false);
    net.peers = vec![vec![(1, 0)], vec![(0, 0)]];
    let timing = Timing { retry_after: 200, attempts: 8 };
    net.nodes = vec![Node::new(1, Some(NameServer::new(1)), timing), Node::new(1, None, timing)];
    net.settle_ids();
    let make = Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner: Owner { uid: 0, gid: 0, mode: 0o600 }, name: None };
    let get = |segment| Request::Get { process: 2, segment, access: ACCESS_READ_WRITE, credentials: rooted() };
    let attach = |access| Request::Attach { process: 2, access, offset: 0, size: PAGE_SIZE };
    let Ok(Reply::Made(old_segment)) = net.call(1, make.clone()) else { panic!("make") };
    let Ok(Reply::Granted { access: old_access, .. }) = net.call(1, get(old_segment)) else { panic!("get") };
    net.nodes[0] = Node::new(1, Some(NameServer::new(2)), timing);
    net.in_flight.clear();
    net.nodes[1].link_down(0, &mut net.memory[1]);
    net.nodes[1].rejoin();
    net.settle_ids();
    let Ok(Reply::Made(new_segment)) = net.call(1, make) else { panic!("make after the restart") };
    let Ok(Reply::Granted { access: new_access, .. }) = net.call(1, get(new_segment)) else { panic!("get after it") };
    assert!(new_segment != old_segment && new_access != old_access);
    assert_eq!(net.call(1, get(old_segment)), Err(Error::NotFound));
    assert_eq!(net.call(1, attach(old_access)), Err(Error::NotFound));
    assert!(matches!(net.call(1, attach(new_access)), Ok(Reply::Attached { segment, .. }) if segment == new_segment));
}

#[test]
fn a_node_that_lost_its_name_server_rejoins_a_new_one_with_a_new_id() {
    // A chain: name server - middle - leaf. The middle node's upstream goes away (its name
    // server restarted); it rejoins, and a fresh name server on the same link gives it an id.
    let mut net = Net::tree(3, 5, 0, false);
    net.peers = vec![vec![(1, 0)], vec![(0, 0), (2, 0)], vec![(1, 1)]];
    let timing = Timing { retry_after: 200, attempts: 8 };
    net.nodes = vec![Node::new(1, Some(NameServer::new(1)), timing), Node::new(2, None, timing), Node::new(1, None, timing)];
    net.settle_ids();
    let leaf = net.nodes[2].id().unwrap();
    let owner = Owner { uid: 0, gid: 0, mode: 0o600 };
    let Ok(Reply::Made(segment)) = net.call(1, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }) else {
        panic!("make")
    };
    // A request in flight when the name server goes: it fails at once on rejoin.
    let pending = net.nodes[1].request(Request::Lookup { name: Name::new(b"x").unwrap() }, &mut net.memory[1]).unwrap();
    net.nodes[1].outbox();
    net.nodes[1].link_down(0, &mut net.memory[1]);
    net.nodes[1].rejoin();
    assert_eq!(net.nodes[1].id(), None);
    assert_eq!(net.nodes[1].route(leaf), None, "the leaf's id was the old name server's");
    assert!(net.nodes[1].completions().iter().any(|c| c.request == pending && c.result == Err(Error::Unreachable)));
    // A name server's node ignores rejoin.
    net.nodes[0].rejoin();
    assert_eq!(net.nodes[0].id(), Some(NAME_SERVER_ENCLAVE));
    // The restarted name server.
    net.nodes[0] = Node::new(1, Some(NameServer::new(2)), timing);
    net.in_flight.clear();
    for _ in 0..200 {
        if net.nodes[1].id().is_some() {
            break;
        }
        net.step();
    }
    let again = net.nodes[1].id().expect("a new id");
    assert!(again >= 2);
    // The leaf was told its id went with the middle node's, rejoined, and has a new one.
    for _ in 0..200 {
        if net.nodes[2].id().is_some_and(|id| id != leaf) {
            break;
        }
        net.step();
    }
    let leaf_again = net.nodes[2].id().expect("the leaf has a new id");
    assert_ne!(leaf_again, again);
    assert_eq!(net.nodes[1].route(leaf_again), Some(1));
    let Ok(Reply::Made(from_leaf)) = net.call(2, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }) else {
        panic!("make from the leaf")
    };
    assert_eq!(from_leaf.enclave(), leaf_again);
    // The old segment is unknown to the new name server; segments made now work.
    assert_eq!(net.call(1, Request::Lookup { name: Name::new(b"x").unwrap() }), Err(Error::NotFound));
    assert_eq!(net.call(1, Request::Remove { process: 1, segment }), Err(Error::NotFound));
    let Ok(Reply::Made(fresh)) = net.call(1, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }) else {
        panic!("make again")
    };
    assert_eq!(fresh.enclave(), again);
}
