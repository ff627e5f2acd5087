//! The name server: the one authority over segment ids, names, access permits and enclave ids
//! (paper section 3.1). It never touches memory: `attach` answers with the owner and the owner's
//! virtual range, and the owner's enclave resolves that range to frames.

use crate::ids::{AccessId, EnclaveId, IdCounter, SegmentId, MAX_ENCLAVE_ID, MAX_NAME_SERVER_LOCAL, NAME_SERVER_ENCLAVE};
use crate::names::{NameTable, Names};
use crate::perm::{self, Credentials, Owner};
use crate::wire::Name;
use crate::{Error, ACCESS_READ_WRITE, MAXADDR_SIZE, PAGE_SIZE, USER_ADDRESS_LIMIT};
use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

/// Who does something: an enclave, and inside it a process (its kernel vouches for the process
/// number; the name server only ever compares it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Principal {
    pub enclave: EnclaveId,
    pub process: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub id: SegmentId,
    pub owner: Principal,
    pub vaddr: u64,
    pub size: u64,
    pub permit: Owner,
    pub name: Option<Name>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Permit {
    segment: SegmentId,
    holder: Principal,
    access: u32,
    attachments: u32,
}

/// What the owner's enclave must resolve for an attach: `[vaddr, vaddr + size)` of `owner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachPlan {
    pub segment: SegmentId,
    pub owner: Principal,
    pub vaddr: u64,
    pub size: u64,
}

/// One line of a segment listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub segment: SegmentId,
    pub owner: EnclaveId,
    /// The owner's process in its enclave: a host pid for the host's segments, a job's pid
    /// inside its enclave otherwise.
    pub process: u64,
    pub size: u64,
    pub name: Option<Name>,
}

pub struct NameServer {
    segments: BTreeMap<SegmentId, Segment>,
    /// Its own, or one shared with other name servers ([`NameServer::share_names`]).
    names: Box<dyn NameTable>,
    permits: BTreeMap<AccessId, Permit>,
    locals: IdCounter,
    enclave_ids: IdCounter,
    enclaves: BTreeSet<EnclaveId>,
}

/// Validates a make request's range; returns the size actually exported.
pub fn validate_range(vaddr: u64, size: u64) -> Result<u64, Error> {
    if size == 0 || vaddr % PAGE_SIZE != 0 {
        return Err(Error::Invalid);
    }
    if size == MAXADDR_SIZE {
        // As XPMEM: "everything from vaddr up" is truncated to the end of user space.
        if vaddr >= USER_ADDRESS_LIMIT {
            return Err(Error::Invalid);
        }
        return Ok(USER_ADDRESS_LIMIT - vaddr);
    }
    if size % PAGE_SIZE != 0 {
        return Err(Error::Invalid);
    }
    match vaddr.checked_add(size) {
        Some(end) if end <= USER_ADDRESS_LIMIT => Ok(size),
        _ => Err(Error::Invalid),
    }
}

impl NameServer {
    /// A name server whose enclave ids and local ids start at places drawn from `instance`
    /// ([`IdCounter`]): each instance (each start of the daemon) should get its own value, so
    /// that ids kept from an earlier instance are not found here.
    pub fn new(instance: u64) -> NameServer {
        let mut enclaves = BTreeSet::new();
        enclaves.insert(NAME_SERVER_ENCLAVE);
        NameServer {
            segments: BTreeMap::new(),
            names: Box::new(Names::default()),
            permits: BTreeMap::new(),
            locals: IdCounter::new(1, MAX_NAME_SERVER_LOCAL, instance),
            enclave_ids: IdCounter::new(NAME_SERVER_ENCLAVE + 1, MAX_ENCLAVE_ID, instance),
            enclaves,
        }
    }

    /// Keeps this name server's names in `table` from now on, which other name servers may
    /// share (one name space across them). The names its segments have move there; one the
    /// table already gives another segment stays with that segment, and the segment here
    /// loses its name (returned: a name is never held twice).
    pub fn share_names(&mut self, mut table: Box<dyn NameTable>) -> Vec<SegmentId> {
        let mut unnamed = Vec::new();
        for segment in self.segments.values_mut() {
            let Some(name) = &segment.name else { continue };
            self.names.release(name, segment.id);
            if table.claim(name, segment.id).is_err() {
                segment.name = None;
                unnamed.push(segment.id);
            }
        }
        self.names = table;
        unnamed
    }

    /// Hands out a fresh enclave id (never 0, never the name server's, never one in use).
    pub fn allocate_enclave(&mut self) -> Result<EnclaveId, Error> {
        for _ in 0..=MAX_ENCLAVE_ID {
            let candidate = self.enclave_ids.next_id();
            if !self.enclaves.contains(&candidate) {
                self.enclaves.insert(candidate);
                return Ok(candidate);
            }
        }
        Err(Error::Exhausted)
    }

    /// A local counter shared by segments and permits; skips values still in use after wrap.
    fn allocate_local(&mut self, enclave: EnclaveId, access: bool) -> Result<u32, Error> {
        for _ in 0..1024 {
            let local = self.locals.next_id();
            let taken = if access {
                AccessId::new(NAME_SERVER_ENCLAVE, local).is_none_or(|id| self.permits.contains_key(&id))
            } else {
                SegmentId::new(enclave, local).is_none_or(|id| self.segments.contains_key(&id))
            };
            if !taken {
                return Ok(local);
            }
        }
        Err(Error::Exhausted)
    }

    pub fn make(&mut self, owner: Principal, vaddr: u64, size: u64, permit: Owner, name: Option<Name>) -> Result<SegmentId, Error> {
        let size = validate_range(vaddr, size)?;
        if permit.mode > perm::MAX_MODE || owner.enclave == 0 {
            return Err(Error::Invalid);
        }
        if name.as_ref().is_some_and(|name| self.names.lookup(name).is_some()) {
            return Err(Error::NameTaken);
        }
        let local = self.allocate_local(owner.enclave, false)?;
        let id = SegmentId::new(owner.enclave, local).ok_or(Error::Invalid)?;
        if let Some(name) = &name {
            // The check above is only a shortcut: in a shared table another name server may
            // have claimed the name since, and the claim decides.
            self.names.claim(name, id)?;
        }
        self.segments.insert(id, Segment { id, owner, vaddr, size, permit, name });
        Ok(id)
    }

    pub fn segment(&self, id: SegmentId) -> Option<&Segment> {
        self.segments.get(&id)
    }

    /// The permits on `id` and who holds them (whose attachments a remove must revoke).
    pub fn permits_on(&self, id: SegmentId) -> Vec<(AccessId, Principal)> {
        self.permits.iter().filter(|(_, p)| p.segment == id).map(|(a, p)| (*a, p.holder)).collect()
    }

    /// The segments `owner` owns.
    pub fn owned_by(&self, owner: Principal) -> Vec<SegmentId> {
        self.segments.values().filter(|s| s.owner == owner).map(|s| s.id).collect()
    }

    /// Removes a segment and every permit on it; only its owner may. Returns the permits dropped.
    pub fn remove(&mut self, caller: Principal, id: SegmentId) -> Result<Vec<AccessId>, Error> {
        let segment = self.segments.get(&id).ok_or(Error::NotFound)?;
        if segment.owner != caller {
            return Err(Error::Denied);
        }
        let segment = self.segments.remove(&id).ok_or(Error::NotFound)?;
        if let Some(name) = &segment.name {
            self.names.release(name, id);
        }
        let dropped: Vec<AccessId> = self.permits.iter().filter(|(_, p)| p.segment == id).map(|(a, _)| *a).collect();
        for apid in &dropped {
            self.permits.remove(apid);
        }
        Ok(dropped)
    }

    /// Grants access: flags must be exactly RDONLY or RDWR, the segment must exist, and the
    /// credentials must pass the owner's mode. Returns the permit and the segment size.
    pub fn get(&mut self, caller: Principal, credentials: &Credentials, id: SegmentId, access: u32) -> Result<(AccessId, u64), Error> {
        crate::validate_access_flags(access)?;
        let segment = self.segments.get(&id).ok_or(Error::NotFound)?;
        perm::check(&segment.permit, credentials, access)?;
        let size = segment.size;
        let local = self.allocate_local(NAME_SERVER_ENCLAVE, true)?;
        let apid = AccessId::new(NAME_SERVER_ENCLAVE, local).ok_or(Error::Invalid)?;
        self.permits.insert(apid, Permit { segment: id, holder: caller, access, attachments: 0 });
        Ok((apid, size))
    }

    fn held(&self, caller: Principal, apid: AccessId) -> Result<&Permit, Error> {
        let permit = self.permits.get(&apid).ok_or(Error::NotFound)?;
        if permit.holder != caller {
            return Err(Error::Denied);
        }
        Ok(permit)
    }

    fn held_permit(&mut self, caller: Principal, apid: AccessId) -> Result<&mut Permit, Error> {
        self.held(caller, apid)?;
        self.permits.get_mut(&apid).ok_or(Error::NotFound)
    }

    pub fn release(&mut self, caller: Principal, apid: AccessId) -> Result<(), Error> {
        self.held_permit(caller, apid)?;
        self.permits.remove(&apid);
        Ok(())
    }

    /// Checks an attach of `[offset, offset + size)` (size rounded up to pages, as XPMEM) and
    /// says which owner range to resolve, counting the attachment on the permit. Attaching
    /// needs a read-write permit (XPMEM maps every attachment read-write and refuses RDONLY
    /// permits with EACCES).
    pub fn attach(&mut self, caller: Principal, apid: AccessId, offset: u64, size: u64) -> Result<AttachPlan, Error> {
        let plan = self.plan_attach(caller, apid, offset, size)?;
        if let Some(permit) = self.permits.get_mut(&apid) {
            permit.attachments = permit.attachments.saturating_add(1);
        }
        Ok(plan)
    }

    /// What [`NameServer::attach`] would answer, without counting an attachment.
    pub fn plan_attach(&self, caller: Principal, apid: AccessId, offset: u64, size: u64) -> Result<AttachPlan, Error> {
        if offset % PAGE_SIZE != 0 || size == 0 {
            return Err(Error::Invalid);
        }
        let size = size.checked_add(PAGE_SIZE - 1).ok_or(Error::Invalid)? & !(PAGE_SIZE - 1);
        let permit = self.held(caller, apid)?;
        if permit.access != ACCESS_READ_WRITE {
            return Err(Error::Denied);
        }
        let segment_id = permit.segment;
        let segment = self.segments.get(&segment_id).ok_or(Error::NotFound)?;
        match offset.checked_add(size) {
            Some(end) if end <= segment.size => {}
            _ => return Err(Error::Invalid),
        }
        Ok(AttachPlan { segment: segment_id, owner: segment.owner, vaddr: segment.vaddr + offset, size })
    }

    pub fn detach(&mut self, caller: Principal, apid: AccessId) -> Result<(), Error> {
        let permit = self.held_permit(caller, apid)?;
        permit.attachments = permit.attachments.saturating_sub(1);
        Ok(())
    }

    /// The segment holding `name`: in a shared table, possibly one another name server keeps.
    pub fn lookup(&self, name: &Name) -> Result<SegmentId, Error> {
        self.names.lookup(name).ok_or(Error::NotFound)
    }

    /// Up to `max` segments with ids above `after`, in id order (page through with the last id).
    pub fn list(&self, after: i64, max: usize) -> Vec<Listing> {
        self.segments
            .values()
            .filter(|s| s.id.raw() > after)
            .take(max)
            .map(|s| Listing { segment: s.id, owner: s.owner.enclave, process: s.owner.process, size: s.size, name: s.name.clone() })
            .collect()
    }

    /// An attacher signals the owner of the segment its permit is on: returns whom to notify.
    pub fn signal(&mut self, caller: Principal, apid: AccessId) -> Result<(Principal, SegmentId), Error> {
        let segment_id = self.held_permit(caller, apid)?.segment;
        let segment = self.segments.get(&segment_id).ok_or(Error::NotFound)?;
        Ok((segment.owner, segment_id))
    }

    /// A process or enclave is gone (exit, crash): its segments and its permits go with it.
    /// Returns the segments removed, so their attachments can be revoked.
    pub fn forget(&mut self, gone: impl Fn(&Principal) -> bool) -> Vec<Segment> {
        let segments = self.remove_owned(&gone);
        self.permits.retain(|_, p| !gone(&p.holder));
        segments
    }

    /// Removes every segment whose owner `owners` selects, with its name and the permits on
    /// it (as if each owner had removed them); permits the owners hold stay. Returns them.
    pub fn remove_owned(&mut self, owners: impl Fn(&Principal) -> bool) -> Vec<Segment> {
        let removed: Vec<SegmentId> = self.segments.values().filter(|s| owners(&s.owner)).map(|s| s.id).collect();
        let mut segments = Vec::new();
        for id in removed {
            if let Some(segment) = self.segments.remove(&id) {
                if let Some(name) = &segment.name {
                    self.names.release(name, id);
                }
                segments.push(segment);
            }
        }
        let ids: BTreeSet<SegmentId> = segments.iter().map(|s| s.id).collect();
        self.permits.retain(|_, p| !ids.contains(&p.segment));
        segments
    }

    /// An enclave is gone: also frees its id for reuse.
    pub fn forget_enclave(&mut self, enclave: EnclaveId) -> Vec<Segment> {
        if enclave != NAME_SERVER_ENCLAVE {
            self.enclaves.remove(&enclave);
        }
        self.forget(|p| p.enclave == enclave)
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    pub fn permit_count(&self) -> usize {
        self.permits.len()
    }
}
