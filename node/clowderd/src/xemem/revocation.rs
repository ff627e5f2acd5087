//! Revocation: bridged permits and daemon holders revoked when segments or enclaves go, and
//! the bookkeeping that waits for the enclaves' acknowledgements.

use super::*;

impl XememLinks {
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

    pub(super) fn revoke_bridged(&self, which: impl Fn(&BridgedPermit) -> bool) {
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
    pub(super) fn enclave_went_away(&self, enclave: EnclaveId) {
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
    pub(super) fn daemon_holders(&self, segments: &[SegmentId]) -> Vec<(AccessId, Principal)> {
        let links = self.links.lock().unwrap();
        let Some(ns) = links.node.name_server() else { return Vec::new() };
        let behind_a_daemon =
            |enclave: EnclaveId| links.node.route(enclave).and_then(|link| links.ram.get(&link)).is_some_and(|frames| frames.is_peer());
        segments
            .iter()
            .flat_map(|segment| ns.permits_on(*segment))
            .filter(|(_, holder)| holder.enclave != NAME_SERVER_ENCLAVE && behind_a_daemon(holder.enclave))
            .collect()
    }

    /// The bridge and outgoing queue of the link that leads to `enclave`, if any.
    pub(super) fn bridge_towards(&self, enclave: EnclaveId) -> Option<(Arc<Mutex<Bridge>>, Outbox)> {
        let links = self.links.lock().unwrap();
        let link = links.node.route(enclave)?;
        Some((links.bridges.get(&link)?.clone(), links.outgoing.get(&link)?.clone()))
    }

    /// Sends each of `holders` a `Revoke` and waits for the acknowledgements (or the deadline):
    /// the holder's daemon has its host process's library, or its enclaves, let go first.
    pub(super) fn revoke_daemon_holders(&self, holders: &[(AccessId, Principal)]) {
        if holders.is_empty() {
            return;
        }
        let waiter = Arc::new(Outstanding::default());
        for (access, holder) in holders {
            if let Some((bridge, queue)) = self.bridge_towards(holder.enclave) {
                bridge.lock().unwrap().send_revoke(holder.enclave, holder.process, *access, Vec::new(), &queue, &waiter);
            }
        }
        waiter.wait(REVOKE_TIMEOUT + Duration::from_secs(1));
    }

    /// Tells every link's port that `gone` went away (its pump revokes bridged permits on it).
    pub(super) fn announce(links: &Links, gone: Gone) {
        for sender in links.gone.values() {
            let _ = sender.send(gone);
        }
    }

    /// Detaches at whoever granted a bridged permit (the permit may be gone with its segment).
    pub(super) fn detach_at_source(&self, caller: Principal, source: Source) {
        self.let_go_at_source(caller, source, true);
    }

    /// Gives a bridged permit back to whoever granted it.
    pub(super) fn release_at_source(&self, caller: Principal, source: Source) {
        self.let_go_at_source(caller, source, false);
    }

    /// Detaches (`detach`) or releases at the permit's source; what it answers does not matter
    /// to the caller, who lets go either way.
    fn let_go_at_source(&self, caller: Principal, source: Source, detach: bool) {
        match source {
            Source::Host { broker_access } => {
                if let Some(broker) = self.broker.get() {
                    let _ = if detach {
                        broker.detach_for_enclave(caller, broker_access)
                    } else {
                        broker.release_for_enclave(caller, broker_access)
                    };
                }
            }
            Source::Enclave { access, proxy } => {
                let process = proxy;
                let _ = self.call(if detach { Request::Detach { process, access } } else { Request::Release { process, access } });
            }
        }
    }
}

/// A `Revoke` the enclave has not acknowledged: the regions stay until it does (its job may
/// still map them), or until the enclave is gone or the deadline passes.
pub(super) struct Revocation {
    pub(super) request: u64,
    pub(super) enclave: EnclaveId,
    pub(super) process: u64,
    /// The enclave's id for the permit.
    pub(super) access: AccessId,
    pub(super) regions: Vec<SharedRegion>,
    pub(super) deadline: Instant,
    pub(super) waiter: Arc<Outstanding>,
}

/// How long an enclave may take to acknowledge a revoke before its regions are removed
/// anyway (an enclave that still maps them then faults: it did not answer in time).
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A count of unfinished revocations that one broker call waits for.
#[derive(Default)]
pub(super) struct Outstanding {
    pub(super) left: Mutex<usize>,
    pub(super) changed: Condvar,
}

impl Outstanding {
    pub(super) fn add(&self) {
        *self.left.lock().unwrap() += 1;
    }
    pub(super) fn finish(&self) {
        *self.left.lock().unwrap() -= 1;
        self.changed.notify_all();
    }
    /// Waits until none is left or `timeout` passed.
    pub(super) fn wait(&self, timeout: Duration) {
        let left = self.left.lock().unwrap();
        let _ = self.changed.wait_timeout_while(left, timeout, |left| *left > 0);
    }
}

impl Revocation {
    /// The enclave let go (or cannot touch the regions any more): they go, and the waiting
    /// broker call hears of it.
    pub(super) fn finish(self, regions: Option<&dyn GuestRegions>) {
        if let Some(machine) = regions {
            for region in &self.regions {
                let _ = machine.remove(region.slot);
            }
        }
        self.waiter.finish();
    }
}

/// A port's way to its node from another thread (a daemon link's remove, which waits for
/// revocations first).
pub(super) struct Remover {
    pub(super) links: Arc<XememLinks>,
    pub(super) link: LinkId,
}

impl Remover {
    /// Revokes every attachment of `segments` (which are going) outside their owner and
    /// waits: host processes' libraries remap theirs (SIGBUS from then on), other enclaves
    /// unmap theirs and acknowledge. The links' lock is not held while waiting.
    pub(super) fn revoke_segments(&self, segments: &[SegmentId]) {
        let holders = self.links.daemon_holders(segments);
        self.revoke_segments_held(segments, &holders);
    }

    /// [`Remover::revoke_segments`], with the daemons' permits on them already taken (a job's
    /// end removes its segments first).
    pub(super) fn revoke_segments_held(&self, segments: &[SegmentId], holders: &[(AccessId, Principal)]) {
        if let Some(broker) = self.links.attachers.get() {
            broker.revoke_remote(|segment| segments.contains(&segment));
        }
        self.links.revoke_segments(segments);
        self.links.revoke_daemon_holders(holders);
    }

    /// The message goes to the node; if it removed `removing` (the name server checked the
    /// owner), other links' permits bridged on it go.
    pub(super) fn receive(&self, bytes: &[u8], removing: Option<SegmentId>) {
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
