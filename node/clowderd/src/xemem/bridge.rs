//! Bridging: enclaves' requests about memory that is not behind their own link (host
//! processes' segments, other enclaves' or daemons'), served here and added to the enclave as
//! guest-physical regions.

use super::*;

/// The uid and gid of a bridged get from a link with no [`EnclaveUser`] (a peer daemon's): the
/// uids inside enclaves mean nothing on the host (LWK jobs all run as root), so only segments
/// whose mode lets everyone in (XEMEM's named segments are 0666) can be had.
pub(super) const ENCLAVE_PROCESS_CREDENTIALS_UID: u32 = 65534;

/// Bridged permits reach the enclave under ids of their own, above every local id the daemon's
/// name server hands out, so the enclave's node never confuses them with permits of the name
/// server, which also carry enclave 1.
pub(super) const FIRST_HOST_PERMIT: u32 = xemem::ids::MAX_NAME_SERVER_LOCAL + 1;

/// The daemon takes permits on enclave segments for other enclaves' processes as these
/// process numbers of enclave 1, far above any host pid.
pub(super) const FIRST_PROXY_PROCESS: u64 = 1 << 40;

/// How many answers to enclaves' bridged requests are kept for their retries.
pub(super) const BRIDGE_ANSWERS_KEPT: usize = 256;

/// Where a permit the bridge holds for an enclave process comes from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Source {
    /// The broker's permit on a host process's segment.
    Host { broker_access: AccessId },
    /// The daemon's own permit, as process `proxy` of enclave 1, on another enclave's segment:
    /// the owner's frames reach the holder as regions of the owner's RAM memfd, so the holder
    /// never sees (nor needs to be trusted with) the owner's guest-physical addresses.
    Enclave { access: AccessId, proxy: u64 },
}

/// A permit an enclave process holds on memory the daemon maps into its machine.
pub(super) struct BridgedPermit {
    pub(super) source: Source,
    pub(super) segment: SegmentId,
    /// The current attachment, or the last one kept after a detach.
    pub(super) attachment: Option<BridgedAttachment>,
    /// An attach through it is being served (the bridge's lock is not held meanwhile).
    pub(super) attaching: bool,
}

/// The guest-physical regions an attach added (one per memory run, in order) and what they
/// hold. After the enclave detaches (and the bridge detached at the source), the regions are
/// kept while the permit is (`mapped` false): an attach of the same range whose source answers
/// with the same runs takes them again, adding and removing no region (a region's removal
/// drops the whole machine's shadow page tables on PVM, and adding one costs the VMM a
/// mapping). A job that attaches the same data at every step (in-situ analytics) then pays
/// little more than its request. The enclave's job cannot reach kept regions (its kernel
/// unmapped them); a revocation of the permit or its release removes them.
pub(super) struct BridgedAttachment {
    pub(super) offset: u64,
    pub(super) size: u64,
    /// What the source's runs were (`None`: unknown, never taken again).
    pub(super) runs: Option<Vec<RunIdentity>>,
    pub(super) frames: Vec<FrameRun>,
    pub(super) regions: Vec<SharedRegion>,
    pub(super) mapped: bool,
    /// Where the owner kernel's count of page-table changes reads in the enclave's machine,
    /// once a read-only region of it was added (one of `regions`).
    pub(super) count_at: Option<u64>,
}

/// An owner's frames for an attach, and (when it publishes one and it stood still) its RAM
/// and its count of page-table changes the frames hold while.
pub(super) type OwnerAnswer = (SegmentId, Vec<FrameRun>, Option<OwnerCount>);

/// An owner enclave's count of page-table changes: the RAM it lies in, and the value an answer
/// holds while.
pub(super) struct OwnerCount {
    pub(super) ram: Arc<dyn FrameSource>,
    pub(super) value: u64,
}

impl BridgedAttachment {
    /// The attachment for a source's answer (`segment`, `runs`) to an attach of
    /// `[offset, offset + size)`: the kept one if it holds the same runs (taken out of `kept`),
    /// else new regions added to the enclave's machine.
    pub(super) fn for_answer(
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
        let same = |attachment: &mut BridgedAttachment| {
            attachment.offset == offset && attachment.size == size && identities.is_some() && attachment.runs == identities
        };
        if let Some(again) = kept.take_if(same) {
            return Ok(BridgedAttachment { mapped: true, ..again });
        }
        let (frames, added) = runs_into_regions(runs, identities.as_deref(), regions)?;
        Ok(BridgedAttachment { offset, size, runs: identities, frames, regions: added, mapped: true, count_at: None })
    }

    /// The word that says how long the answer holds, for an enclave that may use it again
    /// without asking (`MappingWord`): the owner's count, made readable in the enclave's
    /// machine by a read-only region of the block holding it (added once per attachment).
    /// `None` without a count, or when the region cannot be added (the answer is then simply
    /// not used again).
    pub(super) fn valid_while(&mut self, count: Option<OwnerCount>, regions: &dyn GuestRegions) -> Option<MappingWord> {
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
/// and inode) at the same place, or a hole of the same length. `unit` is the size of the
/// file's pages (4 KiB, or 2 MiB on hugetlbfs): a run of whole ones may join others in one
/// region (`runs_into_regions`).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RunIdentity {
    Hole { length: u64 },
    Memory { device: u64, inode: u64, offset: u64, length: u64, unit: u64 },
}

impl RunIdentity {
    /// Whether this run and `next`, side by side in an answer, may be pieces of one region:
    /// whole pages of one file.
    fn joins(&self, next: &RunIdentity) -> bool {
        let whole = |run: &RunIdentity| match *run {
            RunIdentity::Memory { offset, length, unit, .. } => offset % unit == 0 && length % unit == 0,
            RunIdentity::Hole { .. } => false,
        };
        match (self, next) {
            (RunIdentity::Memory { device, inode, .. }, RunIdentity::Memory { device: next_device, inode: next_inode, .. }) => {
                device == next_device && inode == next_inode && whole(self) && whole(next)
            }
            _ => false,
        }
    }
}

/// The identities of `runs`, or `None` if a file cannot be looked at.
pub(super) fn run_identities(runs: &[xemem_host::EnclaveRun]) -> Option<Vec<RunIdentity>> {
    use std::os::unix::fs::MetadataExt;
    runs.iter()
        .map(|run| match run {
            xemem_host::EnclaveRun::Hole { length } => Some(RunIdentity::Hole { length: *length }),
            xemem_host::EnclaveRun::Memory { file, offset, length } => {
                let metadata = File::from(file.try_clone().ok()?).metadata().ok()?;
                let unit = metadata.blksize().max(xemem::PAGE_SIZE);
                Some(RunIdentity::Memory { device: metadata.dev(), inode: metadata.ino(), offset: *offset, length: *length, unit })
            }
        })
        .collect()
}

/// A segment or an enclave that went away: the permits bridged on it are revoked.
#[derive(Clone, Copy, Debug)]
pub(super) enum Gone {
    Segment(SegmentId),
    Enclave(EnclaveId),
}

/// The enclave side's requests served by the daemon itself: about host processes' segments
/// (from the broker) and about other enclaves' segments (through the daemon's own permits).
#[derive(Default)]
pub(super) struct Bridge {
    /// By (the holder's enclave and process, the id the enclave knows).
    pub(super) permits: HashMap<(EnclaveId, u64, AccessId), BridgedPermit>,
    pub(super) next_permit: u32,
    /// Answers already sent, by (origin, request id): a retry gets the same answer instead of
    /// a second attach (the node retries when the broker is slow).
    pub(super) answered: AnswerCache<Vec<Vec<u8>>, BRIDGE_ANSWERS_KEPT>,
    /// Requests being served (a retry of one is dropped: its answer is on its way).
    pub(super) serving: std::collections::HashSet<(EnclaveId, u64)>,
    /// Revokes sent to the enclave and not yet acknowledged.
    pub(super) revocations: Vec<Revocation>,
    pub(super) next_revoke: u64,
    /// The port is gone: a request served meanwhile gives back what it got.
    pub(super) closed: bool,
}

impl Bridge {
    /// Takes away the permits `which` selects (holder enclave, process, permit). Those with an
    /// attachment get a `Revoke` on `queue`; their regions stay until the enclave acknowledges
    /// (`waiter` counts them).
    pub(super) fn revoke_where(
        &mut self,
        which: impl Fn(EnclaveId, u64, &BridgedPermit) -> bool,
        queue: &Outbox,
        waiter: &Arc<Outstanding>,
    ) {
        let chosen: Vec<(EnclaveId, u64, AccessId)> =
            self.permits.iter().filter(|((enclave, process, _), permit)| which(*enclave, *process, permit)).map(|(key, _)| *key).collect();
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
    pub(super) fn send_revoke(
        &mut self,
        enclave: EnclaveId,
        process: u64,
        access: AccessId,
        regions: Vec<SharedRegion>,
        queue: &Outbox,
        waiter: &Arc<Outstanding>,
    ) {
        self.next_revoke += 1;
        let request = self.next_revoke;
        let Ok(bytes) = Message::new(request, NAME_SERVER_ENCLAVE, enclave, Body::Revoke { process, access }).to_bytes() else { return };
        waiter.add();
        self.revocations.push(Revocation {
            request,
            enclave,
            process,
            access,
            regions,
            deadline: Instant::now() + REVOKE_TIMEOUT,
            waiter: waiter.clone(),
        });
        queue.send(bytes);
    }
}

/// Turns the owner's memfd runs into new guest-physical regions of the attaching enclave; on
/// any failure the regions added so far are removed again. Every run is checked first: a
/// memory run must be page-aligned in its file and a non-empty multiple of pages long, and
/// the region the VMM answers with must be page-aligned. Memory runs of one file side by
/// side in the answer (by their `identities`, when known) become ONE region of their pieces
/// where the machine can: a VM owner's scattered 4 KiB pages would otherwise take a memory
/// slot (and a request to the VMM) each, and KVM has 32764 slots.
pub(super) fn runs_into_regions(
    runs: &[xemem_host::EnclaveRun],
    identities: Option<&[RunIdentity]>,
    regions: &dyn GuestRegions,
) -> Result<(Vec<FrameRun>, Vec<SharedRegion>), Error> {
    if runs.is_empty() || runs.len() > xemem::wire::MAX_RUNS_PER_ATTACH as usize {
        return Err(Error::Invalid);
    }
    let identities = identities.filter(|identities| identities.len() == runs.len());
    let mut frames = Vec::with_capacity(runs.len());
    let mut added: Vec<SharedRegion> = Vec::new();
    let mut start = 0;
    while start < runs.len() {
        let joined = identities.map_or(0, |identities| identities[start..].windows(2).take_while(|pair| pair[0].joins(&pair[1])).count());
        let end = start + 1 + joined;
        if let Err(error) = add_runs(&runs[start..end], regions, &mut added, &mut frames) {
            remove_regions(regions, &added);
            return Err(error);
        }
        start = end;
    }
    Ok((frames, added))
}

/// Adds `group` (one run, or several memory runs of one file) to the machine: one region of
/// its pieces where the machine can, else a region per memory run. The regions go to `added`
/// (also on failure, for the caller to remove), the frame runs to `frames`.
fn add_runs(
    group: &[xemem_host::EnclaveRun],
    regions: &dyn GuestRegions,
    added: &mut Vec<SharedRegion>,
    frames: &mut Vec<FrameRun>,
) -> Result<(), Error> {
    use xemem_host::EnclaveRun;
    let page = xemem::PAGE_SIZE;
    for run in group {
        let fits = match run {
            EnclaveRun::Hole { length } => length % page == 0,
            EnclaveRun::Memory { offset, length, .. } => offset % page == 0 && length % page == 0 && *length != 0,
        };
        if !fits {
            return Err(Error::Invalid);
        }
    }
    // A region at `gpa` of `length` bytes, as the enclave's frames.
    let mut push = |gpa: Option<u64>, length: u64| {
        let run = FrameRun { first: gpa.map(|gpa| gpa / page), frames: length / page };
        if gpa.is_some_and(|gpa| gpa % page != 0) || !run.valid() {
            return Err(Error::Invalid);
        }
        frames.push(run);
        Ok(())
    };
    let open = |file: &std::os::fd::OwnedFd| file.try_clone().map(File::from).map_err(|_| Error::Exhausted);
    if let [EnclaveRun::Memory { file, .. }, _, ..] = group {
        let pieces: Vec<clowder_api::vmm::Piece> = group
            .iter()
            .filter_map(|run| match run {
                EnclaveRun::Memory { offset, length, .. } => Some(clowder_api::vmm::Piece { offset: *offset, len: *length }),
                EnclaveRun::Hole { .. } => None,
            })
            .collect();
        let length = pieces.iter().try_fold(0u64, |sum, piece| sum.checked_add(piece.len)).ok_or(Error::Invalid)?;
        if let Some(region) = regions.add_pieces(&open(file)?, &pieces) {
            let region = region.map_err(|_| Error::Exhausted)?;
            added.push(region);
            return push(Some(region.gpa), length);
        }
    }
    for run in group {
        match run {
            EnclaveRun::Hole { length } => push(None, *length)?,
            EnclaveRun::Memory { file, offset, length } => {
                let region = regions.add(&open(file)?, *offset, *length, RegionAccess::ReadWrite).map_err(|_| Error::Exhausted)?;
                added.push(region);
                push(Some(region.gpa), *length)?;
            }
        }
    }
    Ok(())
}

/// What the bridge makes of a message from the enclave side (see [`Bridging::claim`]).
pub(super) enum Claim {
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
pub(super) struct Bridging {
    pub(super) links: Arc<XememLinks>,
    pub(super) link: LinkId,
    pub(super) bridge: Arc<Mutex<Bridge>>,
    pub(super) peer: bool,
    pub(super) user: Option<EnclaveUser>,
}

/// How many bridged requests of one daemon link may be served at once; beyond that a request
/// is answered `Failed(Exhausted)` (a peer cannot make this daemon start threads at will).
pub(super) const MAX_BRIDGING_PER_LINK: usize = 32;

impl Bridging {
    /// Whether `message` is an enclave process's request the daemon answers itself: about a
    /// host process's segment (those live in the broker, not in the node's name server) or
    /// about another enclave's segment (whose memory the daemon maps into this enclave's
    /// machine). Never blocks: serving is [`Bridging::serve`]'s.
    pub(super) fn claim(&self, message: &Message) -> Claim {
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
        if let Some(answers) = bridge.answered.get(origin, header.request) {
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
    pub(super) fn serve(&self, message: &Message, regions: &dyn GuestRegions) -> Vec<Vec<u8>> {
        let header = message.header;
        let origin = header.origin;
        let bodies = self.serve_bridged(origin, &message.body, regions).unwrap_or_else(|error| vec![Body::Failed { error }]);
        self.answered(origin, header.request, bodies)
    }

    /// Encodes the answers to `origin`'s `request` and keeps them for its retries.
    pub(super) fn answered(&self, origin: EnclaveId, request: u64, bodies: Vec<Body>) -> Vec<Vec<u8>> {
        let answers: Vec<Vec<u8>> = bodies
            .into_iter()
            .filter_map(|body| {
                let mut bytes = Vec::new();
                Message::new(request, NAME_SERVER_ENCLAVE, origin, body).encode(&mut bytes).ok().map(|_| bytes)
            })
            .collect();
        let mut bridge = self.bridge.lock().unwrap();
        bridge.serving.remove(&(origin, request));
        bridge.answered.insert(origin, request, answers.clone());
        answers
    }

    /// Drops the answer kept for `origin`'s `request`.
    pub(super) fn forget_answer(&self, origin: EnclaveId, request: u64) {
        self.bridge.lock().unwrap().answered.remove(origin, request);
    }

    /// Queues answers on this link (its pump sends them).
    pub(super) fn send(&self, answers: Vec<Vec<u8>>) {
        if let Some(queue) = self.links.links.lock().unwrap().outgoing.get(&self.link) {
            for answer in answers {
                queue.send(answer);
            }
        }
    }

    pub(super) fn serve_bridged(&self, origin: EnclaveId, body: &Body, regions: &dyn GuestRegions) -> Result<Vec<Body>, Error> {
        let broker = self.links.broker.get();
        let caller = |process: u64| Principal { enclave: origin, process };
        let links = &self.links;
        match body {
            Body::Get { process, segment, access, .. } => {
                let others = self.user.map_or_else(
                    || Credentials { uid: ENCLAVE_PROCESS_CREDENTIALS_UID, groups: vec![ENCLAVE_PROCESS_CREDENTIALS_UID] },
                    |user| user.credentials(),
                );
                let (source, size) = if segment.enclave() == NAME_SERVER_ENCLAVE && broker.is_some() {
                    let (broker_access, size) =
                        broker.ok_or(Error::NotFound)?.get_for_enclave(caller(*process), &others, *segment, *access)?;
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
                bridge
                    .permits
                    .insert((origin, *process, permit), BridgedPermit { source, segment: *segment, attachment: None, attaching: false });
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
                    Source::Enclave { access, proxy } => links.attach_enclave_memory(proxy, access, *offset, *size, true),
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
                let (source, gone) = {
                    let mut bridge = self.bridge.lock().unwrap();
                    let permit = bridge.permits.get_mut(&(origin, *process, *access)).ok_or(Error::NotFound)?;
                    match permit.attachment.as_mut().filter(|attachment| attachment.mapped) {
                        Some(attachment) => {
                            attachment.mapped = false;
                            let gone = if regions.keeps_detached() { None } else { permit.attachment.take() };
                            (Some(permit.source), gone)
                        }
                        None => (None, None),
                    }
                };
                if let Some(gone) = gone {
                    remove_regions(regions, &gone.regions);
                }
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

pub(super) fn remove_regions(regions: &dyn GuestRegions, added: &[SharedRegion]) {
    for region in added {
        let _ = regions.remove(region.slot);
    }
}
