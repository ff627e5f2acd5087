//! The broker's way to other enclaves: a host process's requests about their segments.

use super::*;

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
        self.attach_enclave_memory(process, access, offset, size, false).map(|(_, runs, _)| runs)
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
            let Some((bridge, queue)) = self.bridge_towards(holder.enclave) else { continue };
            let is_this_permit = |enclave: EnclaveId, process: u64, permit: &BridgedPermit| {
                enclave == holder.enclave
                    && process == holder.process
                    && matches!(permit.source, Source::Host { broker_access: b } if b == *broker_access)
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
