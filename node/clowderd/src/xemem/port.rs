//! One enclave's (or daemon's) end of the node: the pump's port, its outbox, and what the
//! enclave's machine must do for host memory.

use super::*;

/// Where a link's outgoing messages wait for its pump. Queuing one wakes the pump, so a
/// message queued by another thread (a host caller, another enclave's pump, the broker) goes
/// out at once rather than after the pump's receive timeout.
#[derive(Clone)]
pub(super) struct Outbox {
    pub(super) queue: mpsc::Sender<Vec<u8>>,
    pub(super) wake: Arc<File>,
}

impl Outbox {
    pub(super) fn send(&self, message: Vec<u8>) {
        if self.queue.send(message).is_ok() {
            // Fails only when the counter would overflow: the pump has wake-ups pending.
            let _ = crate::sys::signal_eventfd(&self.wake);
        }
    }
}

/// One enclave's end of the host's node.
pub struct XememPort {
    pub(super) links: Arc<XememLinks>,
    pub(super) link: LinkId,
    pub(super) outgoing: mpsc::Receiver<Vec<u8>>,
    pub(super) gone: mpsc::Receiver<Gone>,
    pub(super) bridge: Arc<Mutex<Bridge>>,
    /// A link to another daemon: its frames are files it passed, renumbered on arrival.
    pub(super) peer: bool,
    /// Where the bridge adds the memory it answers with, for threads that serve this link's
    /// bridged requests off its pump: a daemon link's frame table, or an LWK enclave's
    /// machine. A bridged request waits for answers that may come back on a link whose pump
    /// waits for this one: two enclaves' ranks attaching each other's memory at once (UCX's
    /// xpmem transport in MPI_Allreduce) each held its pump until the other's timed out, 5 s
    /// later (ETIMEDOUT in one run of five). `None`: served on the pump, with the regions
    /// [`XememPort::from_enclave`] is given.
    pub(super) bridge_regions: Option<Arc<dyn GuestRegions + Send + Sync>>,
    /// How many of this link's bridged requests are being served on threads.
    pub(super) workers: Arc<std::sync::atomic::AtomicUsize>,
    /// A sub-manager's link to the daemon above it.
    pub(super) upstream: bool,
    /// The host user whose enclave this is ([`XememPort::for_user`]).
    pub(super) user: Option<EnclaveUser>,
}

/// The host user an enclave's processes act as in XEMEM. The LWK runs every job as root,
/// which means nothing on the host: the segments an enclave makes are its owner's, and its
/// gets of other enclaves' or host processes' segments are made in its owner's name (so two
/// enclaves of one user share 0600 segments, as that user's host processes do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnclaveUser {
    pub uid: u32,
    pub gid: u32,
}

impl EnclaveUser {
    pub(super) fn credentials(&self) -> Credentials {
        Credentials { uid: self.uid, groups: vec![self.gid] }
    }
}

/// What an enclave's machine must do for an attach of host memory: make a range of a memfd a
/// new guest-physical region, and take it away again.
pub trait GuestRegions {
    fn add(&self, file: &File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String>;
    /// Makes `pieces` of `file`, end to end, ONE new guest-physical region: an owner's
    /// scattered frames (a VM's 4 KiB pages) in one memory slot. `None`: this machine cannot,
    /// and each piece is a region of its own.
    fn add_pieces(&self, _file: &File, _pieces: &[clowder_api::vmm::Piece]) -> Option<Result<SharedRegion, String>> {
        None
    }
    fn remove(&self, slot: u32) -> Result<(), String>;
    /// Whether an attachment's regions may stay after its detach, to be taken again by an
    /// attach of the same range (see `BridgedAttachment`).
    fn keeps_detached(&self) -> bool {
        true
    }
}

impl XememPort {
    pub fn link(&self) -> LinkId {
        self.link
    }

    /// This enclave's processes act as `user` (see [`EnclaveUser`]).
    pub fn for_user(mut self, user: EnclaveUser) -> XememPort {
        self.user = Some(user);
        self
    }

    /// A make from this enclave, owned by its user rather than by the uid the kernel put in.
    fn as_user(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let user = self.user?;
        let mut message = Message::decode(bytes).ok()?;
        let Body::Make { uid, gid, .. } = &mut message.body else { return None };
        (*uid, *gid) = (user.uid, user.gid);
        message.to_bytes().ok()
    }

    /// One message the enclave sent (not yet decoded: the node validates it). Requests about
    /// host processes' segments are served by the broker, with `regions` (the enclave's
    /// machine) adding the owner's memory as guest-physical regions.
    pub fn from_enclave(&self, bytes: &[u8], regions: &dyn GuestRegions) {
        let made_by_user = self.as_user(bytes);
        let bytes = made_by_user.as_deref().unwrap_or(bytes);
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
                // A bridged request may wait for answers that come back on this very link (or
                // on a link whose pump waits for this one): not on its pump where it can.
                Claim::Serve => match &self.bridge_regions {
                    Some(regions) => {
                        let (regions, workers) = (regions.clone(), self.workers.clone());
                        if workers.fetch_add(1, std::sync::atomic::Ordering::AcqRel) >= MAX_BRIDGING_PER_LINK {
                            workers.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                            // Not kept for retries: a retry (the caller's, as for any
                            // failure) may find a free worker.
                            let answers = bridging.answered(
                                message.header.origin,
                                message.header.request,
                                vec![Body::Failed { error: Error::Exhausted }],
                            );
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
                let owned = self
                    .links
                    .links
                    .lock()
                    .unwrap()
                    .node
                    .name_server()
                    .and_then(|ns| ns.segment(segment))
                    .is_some_and(|s| s.owner == owner);
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

    pub(super) fn bridging(&self) -> Bridging {
        Bridging { links: self.links.clone(), link: self.link, bridge: self.bridge.clone(), peer: self.peer, user: self.user }
    }

    pub(super) fn remover(&self) -> Remover {
        Remover { links: self.links.clone(), link: self.link }
    }

    /// Whether a message from this enclave may reach the node: it speaks only for enclaves
    /// behind this link (origin 0 is discovery, before an id), and its frame runs are its
    /// own guest-physical addresses, meaningless in any other machine, so they go only to the
    /// name server or on to a daemon link, which sends them as ranges of its RAM memfd (other
    /// enclaves get its memory through the bridge, as regions).
    pub(super) fn may_pass(&self, message: &Message) -> bool {
        let origin = message.header.origin;
        let links = self.links.links.lock().unwrap();
        // Enclaves we have no route to lie towards the name server (for a sub-manager).
        if origin != 0 && links.node.route(origin).or(links.node.link_towards_name_server()) != Some(self.link) {
            return false;
        }
        // A peer daemon's frames were renumbered into this daemon's own frame space on arrival
        // (`peer`): they may complete this node's own requests, or go on to another
        // daemon (as files again: a sub-manager's daemon below answering the name server
        // above), never to an enclave.
        let destination = message.header.destination;
        let frames_for = if self.peer { links.node.id().unwrap_or(NAME_SERVER_ENCLAVE) } else { NAME_SERVER_ENCLAVE };
        let next = links.node.route(destination).or(links.node.link_towards_name_server());
        // Frames leave this daemon only as files (`peer` names an enclave's frames as
        // ranges of its RAM memfd, checked against its RAM), so an enclave's answer may go on
        // to a daemon too: a requester whose permit the name server granted directly, because
        // the owner lies behind the same daemon link as the requester (see `Bridging::claim`).
        let onward_to_a_daemon =
            next != Some(self.link) && next.and_then(|link| links.ram.get(&link)).is_some_and(|frames| frames.is_peer());
        !matches!(message.body, Body::Attached(_)) || destination == frames_for || onward_to_a_daemon
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
    pub(super) fn revoke_segments(&self, segments: &[SegmentId]) {
        self.remover().revoke_segments(segments);
    }

    /// Segments or enclaves went away: the permits bridged on them are revoked (nobody waits
    /// for these acknowledgements; the regions go when they come).
    pub(super) fn revoke_gone(&self, gone: &[Gone]) {
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
    pub(super) fn revoked(&self, request: u64, origin: EnclaveId, process: u64, access: AccessId, regions: &dyn GuestRegions) -> bool {
        let mut bridge = self.bridge.lock().unwrap();
        let matching = bridge
            .revocations
            .iter()
            .position(|r| r.request == request && r.enclave == origin && r.process == process && r.access == access);
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
            // are unlinked by their links (`peer`) and link again.
            self.links.revoke_bridged(|permit| matches!(permit.source, Source::Enclave { .. }));
            if let Some(broker) = self.links.attachers.get() {
                broker.upstream_lost();
            }
            log::warn!("xemem: the name server is out of reach: its segments and permits here are gone");
        }
    }
}
