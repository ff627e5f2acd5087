//! XEMEM on the host, with no kernel module: the segment broker.
//!
//! `libxpmem` (xemem/src/) in every process talks to the broker over a Unix socket ([`wire`]
//! describes the packets). The broker is the name server for the host enclave (it
//! embeds [`xemem::NameServer`]; a process is the principal `(enclave 1, pid)`, its credentials
//! come from SO_PEERCRED) and brokers memory by file descriptor:
//!
//! * an owner's library opens a second connection and sends `SERVE` on it; the broker then asks
//!   that connection to `FETCH` a range when someone attaches. The owner answers with runs of
//!   `(memfd, offset, length)` and holes, passing the memfds with SCM_RIGHTS; private memory is
//!   converted to memfd-backed memory in place by the owner's library, so no page is copied
//!   at attach time and the attacher maps the owner's very pages;
//! * the broker checks the answer (lengths add up, runs inside their files, descriptors are
//!   regular files) and hands runs and descriptors to the attacher, which maps them.
//!
//! Revocation: when an owner's last connection closes (exit, crash, kill), its segments and
//! permits are dropped and every memfd its library converted (flag [`wire::RUN_REVOCABLE`]) is
//! truncated to zero, so its attachers get SIGBUS as with XPMEM. On `xpmem_remove` the owner's
//! library does the same itself after moving its own pages to a fresh memfd (see the library).
//! Other enclaves cannot be truncated under: their machines map the memory as guest-physical
//! regions. So before a remove is answered, and before an exited owner's memfds are truncated,
//! the broker has [`Enclaves::revoke`] take their attachments away (outside its lock).
//! Memfds the application made itself are never truncated: they may be shared by other means
//! (a VMM's guest memory, say), so attachments to them outlive remove (documented deviation).
//!
//! `clowderd` embeds [`Broker`] and hands it accepted connections
//! ([`Broker::serve_connection`]); `xemem-broker` is the standalone binary for tests.
//!
//! Other enclaves: `clowderd` also gives the broker its XEMEM name-server node as
//! [`Enclaves`]. A host process's `get` of a segment of another enclave, its `lookup` of a name
//! the host does not know, and everything done with the permits those gets return go there.
//! An attach then answers with ranges of the owner enclave's RAM memfd (checked against that
//! enclave's RAM by the daemon), which the library maps like any owner's runs. Such permits
//! reach the library under surrogate ids from the broker (see `State::remote_permits`), since
//! both name servers number their permits in enclave 1. Their names are one table
//! ([`Broker::share_names`]): a name is held once, by host process or enclave.

mod names;
pub mod wire;

pub use names::SharedNames;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use clowder_sys as sys;
use wire::{Answer, Request, Run};
use xemem::ids::{IdCounter, MAX_LOCAL_ID, MAX_NAME_SERVER_LOCAL};
use xemem::nameserver::Listing;
use xemem::wire::Name;
use xemem::{AccessId, Credentials, Error, NameServer, Owner, Principal, SegmentId, NAME_SERVER_ENCLAVE};

/// How long an owner may take to answer a FETCH (it may be converting a large range).
const OWNER_TIMEOUT: Duration = Duration::from_secs(30);

type Server = Arc<Mutex<OwnedFd>>;

/// The name server of the other enclaves (clowderd's XEMEM node), for host processes'
/// requests about segments that are not the host's. Calls block until the answer comes.
pub trait Enclaves: Send + Sync {
    fn lookup(&self, name: &Name) -> Result<SegmentId, Error>;
    /// A permit for host process `process`; returns it and the segment size.
    fn get(&self, process: u64, credentials: Credentials, segment: SegmentId, access: u32) -> Result<(AccessId, u64), Error>;
    /// The owner's memory for `[offset, offset + size)`, run by run (already bounds-checked).
    fn attach(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Result<Vec<EnclaveRun>, Error>;
    fn detach(&self, process: u64, access: AccessId) -> Result<(), Error>;
    fn release(&self, process: u64, access: AccessId) -> Result<(), Error>;
    /// The host memory behind these permits of other enclaves' processes (this broker's ids)
    /// is going: the owner removed the segment or is gone. Each holder's enclave must unmap
    /// its attachments before the memory is truncated, or its machine would touch memory that
    /// is no longer there. Returns once every holder acknowledged, its enclave is gone, or a
    /// timeout passed.
    fn revoke(&self, permits: &[(Principal, AccessId)]);
    /// Host process `process` signals the owner of the enclave segment its permit `access` is
    /// on (XEMEM's `xemem_signal`): the owner's kernel wakes its notification descriptors.
    fn signal(&self, _process: u64, _access: AccessId) -> Result<(), Error> {
        Err(Error::Invalid)
    }
    /// A segment of host process `process`, made at a name server elsewhere: only for a
    /// sub-manager's broker ([`Broker::set_sub_manager`]), whose daemon is not the name server.
    fn make(&self, _process: u64, _vaddr: u64, _size: u64, _owner: Owner, _name: Option<Name>) -> Result<SegmentId, Error> {
        Err(Error::Invalid)
    }
    /// Removes a segment [`Enclaves::make`] made.
    fn remove(&self, _process: u64, _segment: SegmentId) -> Result<(), Error> {
        Err(Error::Invalid)
    }
}

/// A piece of an enclave's segment: a range of a file (the enclave's RAM memfd), or a hole.
pub enum EnclaveRun {
    Memory { file: OwnedFd, offset: u64, length: u64 },
    Hole { length: u64 },
}

/// Whether an operation through a permit ends it ([`Broker::through_permit`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Forget {
    Yes,
    No,
}

/// Surrogate permit ids for other enclaves' permits: above every local id the broker's own
/// name server hands out.
const FIRST_SURROGATE: u32 = MAX_NAME_SERVER_LOCAL + 1;

struct State {
    ns: NameServer,
    /// pid -> its library's serving connection.
    servers: HashMap<u32, Server>,
    /// pid -> memfds its library converted, by (device, inode): truncated when it is gone.
    revocable: HashMap<u32, HashMap<(u64, u64), OwnedFd>>,
    /// pid -> open call connections.
    connections: HashMap<u32, usize>,
    /// Permits on other enclaves' segments, by the surrogate id the holder knows them by.
    remote_permits: HashMap<AccessId, RemotePermit>,
    surrogates: IdCounter,
    /// A sub-manager's segments, made at the upstream name server: segment -> (owner pid,
    /// vaddr, length), to check the name server's requests to serve them.
    remote_segments: HashMap<SegmentId, (u32, u64, u64)>,
    /// A sub-manager's segments and permits from a name server that is gone
    /// ([`Broker::upstream_lost`]): by id, the process that made or holds them. Its remove or
    /// release of them succeeds here; nothing upstream knows them any more.
    orphaned_segments: HashMap<SegmentId, u32>,
    orphaned_permits: HashMap<AccessId, u32>,
}

impl State {
    /// A broker's state whose ids (segments, permits, surrogates) start where `instance` says.
    fn new(instance: u64) -> State {
        State {
            ns: NameServer::new(instance),
            servers: HashMap::new(),
            revocable: HashMap::new(),
            connections: HashMap::new(),
            remote_permits: HashMap::new(),
            surrogates: IdCounter::new(FIRST_SURROGATE, MAX_LOCAL_ID, instance),
            remote_segments: HashMap::new(),
            orphaned_segments: HashMap::new(),
            orphaned_permits: HashMap::new(),
        }
    }
}

/// A host process's permit on another enclave's segment.
#[derive(Clone, Copy)]
struct RemotePermit {
    /// The enclave name server's id for it.
    real: AccessId,
    holder: u32,
    segment: SegmentId,
}

/// How long a holder's library may take to unmap an enclave segment's attachments
/// ([`Broker::revoke_remote`]): it only remaps them; one that does not answer in time keeps
/// the old pages (it is stopped or gone) and the revocation goes on without it.
const REVOKE_WAIT: Duration = Duration::from_millis(500);

#[derive(Clone)]
pub struct Broker {
    state: Arc<Mutex<State>>,
    owner_timeout: Duration,
    enclaves: Arc<OnceLock<Arc<dyn Enclaves>>>,
    /// Set when the daemon is a sub-manager: host processes' segments live at the upstream
    /// name server (through [`Enclaves`]), never in this broker's own name server.
    sub_manager: Arc<OnceLock<()>>,
}

impl Default for Broker {
    fn default() -> Broker {
        // A random instance: a restarted broker's ids are not its predecessor's, so one a
        // process kept from before the restart is not found (ENOENT) rather than naming
        // another process's segment.
        let state = Arc::new(Mutex::new(State::new(sys::random_instance())));
        Broker { state, owner_timeout: OWNER_TIMEOUT, enclaves: Arc::default(), sub_manager: Arc::default() }
    }
}

fn principal(pid: u32) -> Principal {
    Principal { enclave: NAME_SERVER_ENCLAVE, process: pid as u64 }
}

/// Effective uid, effective gid and supplementary groups of `pid` (from /proc, since
/// SO_PEERCRED has no groups).
fn credentials(peer: &sys::Peer) -> Credentials {
    let mut groups = vec![peer.gid];
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", peer.pid)) {
        if let Some(line) = status.lines().find(|l| l.starts_with("Groups:")) {
            groups.extend(line[7..].split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    groups.truncate(xemem::perm::MAX_GROUPS);
    Credentials { uid: peer.uid, groups }
}

impl Broker {
    pub fn new() -> Broker {
        Broker::default()
    }

    /// How long an owner may take to answer a FETCH before the attach fails (default 30 s).
    pub fn with_owner_timeout(mut self, timeout: Duration) -> Broker {
        self.owner_timeout = timeout;
        self
    }

    /// Where requests about other enclaves' segments go (once; false if already set).
    pub fn set_enclaves(&self, enclaves: Arc<dyn Enclaves>) -> bool {
        self.enclaves.set(enclaves).is_ok()
    }

    /// Keeps the names of host processes' segments in `names`, which the daemon's node shares:
    /// one name space for host processes and enclaves (a name held on either side is refused
    /// on the other, and lookups on both sides find its first holder). A name held already
    /// on both sides stays with the other side's segment; the host's loses it.
    pub fn share_names(&self, names: SharedNames) {
        let unnamed = self.lock().ns.share_names(Box::new(names));
        if !unnamed.is_empty() {
            log::warn!("xemem: {} host segment(s) lost their names, held already by enclaves' segments", unnamed.len());
        }
    }

    /// Makes this broker a sub-manager's: every make, remove and get of its host processes goes
    /// to the name server behind [`Enclaves`] (an upstream daemon), so their segids are global
    /// and name the sub-manager's enclave id. Attaches of those segments are served with
    /// [`Broker::serve_for_name_server`].
    pub fn set_sub_manager(&self) {
        let _ = self.sub_manager.set(());
    }

    fn is_sub_manager(&self) -> bool {
        self.sub_manager.get().is_some()
    }

    fn remote(&self) -> Result<&Arc<dyn Enclaves>, Error> {
        self.enclaves.get().ok_or(Error::NotFound)
    }

    /// The enclave permit behind a surrogate `access`, if it is one; EACCES if `pid` does not
    /// hold it.
    fn remote_permit(&self, pid: u32, access: AccessId) -> Result<Option<AccessId>, Error> {
        match self.lock().remote_permits.get(&access) {
            Some(permit) if permit.holder == pid => Ok(Some(permit.real)),
            Some(_) => Err(Error::Denied),
            None => Ok(None),
        }
    }

    /// A release, detach or signal by process `pid` through `access`: a permit orphaned by a
    /// lost name server succeeds here (`forget`: and goes, for a release; a detach or signal
    /// leaves it for the release that follows); a surrogate for a permit at the name server
    /// upstream is passed there (`upstream`, with the real permit, forgotten first for a
    /// release); any other is this broker's own (`local`).
    fn through_permit(
        &self,
        pid: u32,
        access: AccessId,
        forget: Forget,
        upstream: impl FnOnce(&dyn Enclaves, u64, AccessId) -> Result<(), Error>,
        local: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        {
            let mut state = self.lock();
            if state.orphaned_permits.get(&access) == Some(&pid) {
                if forget == Forget::Yes {
                    state.orphaned_permits.remove(&access);
                }
                return Ok(());
            }
        }
        if let Some(real) = self.remote_permit(pid, access)? {
            if forget == Forget::Yes {
                self.lock().remote_permits.remove(&access);
            }
            return upstream(self.remote()?.as_ref(), pid as u64, real);
        }
        local()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread must not take the broker down with it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Listens on `path` and serves every connection on its own thread, forever.
    pub fn listen_and_serve(&self, path: &Path) -> io::Result<()> {
        let listener = sys::listen(path)?;
        log::info!("listening on {}", path.display());
        loop {
            let connection = sys::accept(&listener)?;
            let broker = self.clone();
            std::thread::spawn(move || broker.serve_connection(connection));
        }
    }

    /// Segments known to the name server, for `clowder xemem ls`.
    pub fn list(&self) -> Vec<Listing> {
        self.lock().ns.list(0, usize::MAX)
    }

    /// Serves one library connection until it closes (or, after SERVE, keeps it for FETCH).
    pub fn serve_connection(&self, connection: OwnedFd) {
        let Ok(peer) = sys::peer(&connection) else { return };
        *self.lock().connections.entry(peer.pid).or_default() += 1;
        let mut buffer = vec![0u8; wire::HEADER_LEN + xemem::wire::MAX_NAME_LEN];
        let mut kept_for_serving = false;
        loop {
            let (length, fds) = match sys::receive(&connection, &mut buffer) {
                Ok((0, _)) => break,
                Ok(packet) => packet,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    let _ = sys::send(&connection, &Answer::error(0, libc::EPROTO).encode(), &[]);
                    continue;
                }
                Err(_) => break,
            };
            drop(fds); // requests carry no descriptors
            let request = match Request::decode(&buffer[..length]) {
                Ok(request) => request,
                Err(_) => {
                    let op = if length >= 8 { u16::from_le_bytes([buffer[6], buffer[7]]) } else { 0 };
                    let _ = sys::send(&connection, &Answer::error(op, libc::EPROTO).encode(), &[]);
                    continue;
                }
            };
            if request.op == wire::OP_SERVE {
                kept_for_serving = sys::set_receive_timeout(&connection, self.owner_timeout).is_ok();
                break;
            }
            let (answer, fds) = self.handle(&peer, &request);
            let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            if sys::send(&connection, &answer.encode(), &borrowed).is_err() {
                break;
            }
        }
        if kept_for_serving {
            // Registered before the answer goes out, so the MAKE that follows finds it.
            let server = Arc::new(Mutex::new(connection));
            {
                let mut state = self.lock();
                if let Some(count) = state.connections.get_mut(&peer.pid) {
                    *count -= 1;
                }
                state.servers.insert(peer.pid, server.clone());
            }
            let connection = server.lock().unwrap_or_else(|p| p.into_inner());
            let _ = sys::send(&connection, &Answer::ok(wire::OP_SERVE, &[]).encode(), &[]);
        } else {
            self.connection_closed(peer.pid);
        }
    }

    /// The last call connection of `pid` closed: the process is gone (or forked children
    /// closed their copies, which the library does without telling us, so count).
    fn connection_closed(&self, pid: u32) {
        let forgotten = {
            let mut state = self.lock();
            let remaining = {
                let count = state.connections.entry(pid).or_default();
                *count = count.saturating_sub(1);
                *count
            };
            if remaining > 0 {
                return;
            }
            state.connections.remove(&pid);
            self.forget_locked(&mut state, pid)
        };
        self.revoke_and_truncate(forgotten);
    }

    /// Drops everything `pid` owned or held and revokes its converted memory.
    pub fn forget_process(&self, pid: u32) {
        let forgotten = self.forget_locked(&mut self.lock(), pid);
        self.revoke_and_truncate(forgotten);
    }

    /// Other enclaves' permits on `segments`: their attachments must go before the memory.
    fn enclave_holders(state: &State, segments: &[SegmentId]) -> Vec<(Principal, AccessId)> {
        segments
            .iter()
            .flat_map(|segment| state.ns.permits_on(*segment))
            .filter(|(_, holder)| holder.enclave != NAME_SERVER_ENCLAVE)
            .map(|(access, holder)| (holder, access))
            .collect()
    }

    /// Has the holders' enclaves unmap their attachments (waiting, so never under the state
    /// lock: the daemon's enclave links call the broker meanwhile).
    fn revoke_for_enclaves(&self, holders: &[(Principal, AccessId)]) {
        if let (false, Some(enclaves)) = (holders.is_empty(), self.enclaves.get()) {
            enclaves.revoke(holders);
        }
    }

    /// Finishes a forget outside the state lock: enclaves unmap first, then the memory goes.
    fn revoke_and_truncate(&self, forgotten: Forgotten) {
        if let (false, Some(enclaves)) = (forgotten.upstream.is_empty(), self.enclaves.get()) {
            for segment in &forgotten.upstream {
                let _ = enclaves.remove(forgotten.pid as u64, *segment);
            }
        }
        self.revoke_for_enclaves(&forgotten.enclave_holders);
        for fd in forgotten.memfds {
            let _ = sys::truncate_to_zero(&fd);
        }
    }

    fn forget_locked(&self, state: &mut State, pid: u32) -> Forgotten {
        let me = principal(pid);
        let enclave_holders = Self::enclave_holders(state, &state.ns.owned_by(me));
        let held: Vec<AccessId> = state.remote_permits.iter().filter(|(_, permit)| permit.holder == pid).map(|(s, _)| *s).collect();
        if !held.is_empty() {
            let permits: Vec<AccessId> = held.iter().filter_map(|s| state.remote_permits.remove(s)).map(|permit| permit.real).collect();
            if let Some(enclaves) = self.enclaves.get().cloned() {
                // Off this thread: the broker's lock is held here, and the call waits for the
                // name server.
                std::thread::spawn(move || {
                    for permit in permits {
                        let _ = enclaves.release(pid as u64, permit);
                    }
                });
            }
        }
        // A sub-manager's segments are removed upstream before the memory is truncated (the
        // removes revoke enclave attachments first), outside the lock.
        let upstream: Vec<SegmentId> = state.remote_segments.iter().filter(|(_, (owner, _, _))| *owner == pid).map(|(s, _)| *s).collect();
        for segment in &upstream {
            state.remote_segments.remove(segment);
        }
        state.orphaned_segments.retain(|_, owner| *owner != pid);
        state.orphaned_permits.retain(|_, holder| *holder != pid);
        state.ns.forget(|p| *p == me);
        state.servers.remove(&pid);
        let memfds = state.revocable.remove(&pid).map(|memfds| memfds.into_values().collect()).unwrap_or_default();
        Forgotten { pid, upstream, enclave_holders, memfds }
    }

    fn handle(&self, peer: &sys::Peer, request: &Request) -> (Answer, Vec<OwnedFd>) {
        let op = request.op;
        let me = principal(peer.pid);
        let a = request.args;
        let result: Result<Answer, Error> = (|| match op {
            wire::OP_HELLO => Ok(Answer::ok(op, &[wire::VERSION as u64])),
            wire::OP_MAKE => {
                let name = if request.name.is_empty() { None } else { Some(Name::new(&request.name)?) };
                if a[2] > 0o777 {
                    return Err(Error::Invalid);
                }
                let owner = Owner { uid: peer.uid, gid: peer.gid, mode: a[2] as u32 };
                if self.is_sub_manager() {
                    if !self.lock().servers.contains_key(&peer.pid) {
                        return Err(Error::Invalid);
                    }
                    let length = xemem::nameserver::validate_range(a[0], a[1])?;
                    let segment = self.remote()?.make(peer.pid as u64, a[0], a[1], owner, name)?;
                    self.lock().remote_segments.insert(segment, (peer.pid, a[0], length));
                    return Ok(Answer::ok(op, &[segment.raw() as u64]));
                }
                let mut state = self.lock();
                if !state.servers.contains_key(&peer.pid) {
                    return Err(Error::Invalid); // the library registers SERVE before making
                }
                let segment = state.ns.make(me, a[0], a[1], owner, name)?;
                Ok(Answer::ok(op, &[segment.raw() as u64]))
            }
            wire::OP_REMOVE => {
                let segment = SegmentId::from_raw(a[0] as i64).ok_or(Error::Invalid)?;
                if self.is_sub_manager() {
                    // Removed already, with the name server that knew it: done.
                    let mut state = self.lock();
                    if state.orphaned_segments.get(&segment) == Some(&peer.pid) {
                        state.orphaned_segments.remove(&segment);
                        return Ok(Answer::ok(op, &[]));
                    }
                    drop(state);
                    // The name server checks that the caller owns it; the owner's library then
                    // truncates, so attachers anywhere get SIGBUS.
                    self.remote()?.remove(peer.pid as u64, segment)?;
                    self.lock().remote_segments.remove(&segment);
                    return Ok(Answer::ok(op, &[]));
                }
                let holders = {
                    let mut state = self.lock();
                    let holders = Self::enclave_holders(&state, &[segment]);
                    state.ns.remove(me, segment)?;
                    holders
                };
                // The owner's library truncates the memory once it has this answer: the
                // enclaves attached to it let go first.
                self.revoke_for_enclaves(&holders);
                Ok(Answer::ok(op, &[]))
            }
            wire::OP_GET => {
                let segment = SegmentId::from_raw(a[0] as i64).ok_or(Error::Invalid)?;
                let flags = u32::try_from(a[1]).map_err(|_| Error::Invalid)?;
                xemem::validate_access_flags(flags)?;
                let who = credentials(peer);
                if segment.enclave() != NAME_SERVER_ENCLAVE || self.is_sub_manager() {
                    let (real, size) = self.remote()?.get(peer.pid as u64, who, segment, flags)?;
                    let mut state = self.lock();
                    let surrogate = loop {
                        let candidate = AccessId::new(NAME_SERVER_ENCLAVE, state.surrogates.next_id()).ok_or(Error::Exhausted)?;
                        if !state.remote_permits.contains_key(&candidate) && !state.orphaned_permits.contains_key(&candidate) {
                            break candidate;
                        }
                    };
                    state.remote_permits.insert(surrogate, RemotePermit { real, holder: peer.pid, segment });
                    // The library must serve: its attachments are revoked by message.
                    return Ok(Answer::ok(op, &[surrogate.raw() as u64, size, wire::GET_REVOKED_BY_MESSAGE]));
                }
                let (access, size) = self.lock().ns.get(me, &who, segment, flags)?;
                Ok(Answer::ok(op, &[access.raw() as u64, size]))
            }
            wire::OP_RELEASE | wire::OP_DETACH => {
                let access = AccessId::from_raw(a[0] as i64).ok_or(Error::Invalid)?;
                // Both let go of a permit's attachments, wherever it was granted; only a release
                // ends the permit.
                let release = op == wire::OP_RELEASE;
                self.through_permit(
                    peer.pid,
                    access,
                    if release { Forget::Yes } else { Forget::No },
                    |up, pid, real| if release { up.release(pid, real) } else { up.detach(pid, real) },
                    || {
                        let mut state = self.lock();
                        if release {
                            state.ns.release(me, access)
                        } else {
                            state.ns.detach(me, access)
                        }
                    },
                )?;
                Ok(Answer::ok(op, &[]))
            }
            wire::OP_LOOKUP => {
                let name = Name::new(&request.name)?;
                let local = self.lock().ns.lookup(&name);
                let segment = match (local, self.enclaves.get()) {
                    (Err(Error::NotFound), Some(enclaves)) => enclaves.lookup(&name)?,
                    (result, _) => result?,
                };
                Ok(Answer::ok(op, &[segment.raw() as u64]))
            }
            wire::OP_SIGNAL => {
                let access = AccessId::from_raw(a[0] as i64).ok_or(Error::Invalid)?;
                self.through_permit(peer.pid, access, Forget::No, |up, pid, real| up.signal(pid, real), || self.signal(me, access))?;
                Ok(Answer::ok(op, &[]))
            }
            _ => Err(Error::Invalid),
        })();
        if op == wire::OP_ATTACH {
            let remote = AccessId::from_raw(a[0] as i64).map(|access| self.remote_permit(peer.pid, access));
            if let Some(remote) = remote {
                match remote {
                    Ok(Some(real)) => {
                        return match self.attach_remote(peer.pid, real, a[1], a[2]) {
                            Ok(pair) => pair,
                            Err(e) => (Answer::failure(op, e), Vec::new()),
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return (Answer::failure(op, e), Vec::new()),
                }
            }
            return match self.attach(me, a[0], a[1], a[2]) {
                Ok(pair) => pair,
                Err(e) => (Answer::failure(op, e), Vec::new()),
            };
        }
        match result {
            Ok(answer) => (answer, Vec::new()),
            Err(e) => (Answer::failure(op, e), Vec::new()),
        }
    }

    /// An attach through a permit on another enclave's segment: the enclave's runs, as the
    /// library receives any owner's (never revocable: enclave RAM cannot be truncated).
    fn attach_remote(&self, pid: u32, access: AccessId, offset: u64, size: u64) -> Result<(Answer, Vec<OwnedFd>), Error> {
        if offset % xemem::PAGE_SIZE != 0 || size == 0 {
            return Err(Error::Invalid);
        }
        let size = size.checked_add(xemem::PAGE_SIZE - 1).ok_or(Error::Invalid)? & !(xemem::PAGE_SIZE - 1);
        let pieces = self.remote()?.attach(pid as u64, access, offset, size)?;
        let mut runs = Vec::with_capacity(pieces.len());
        let mut fds: Vec<OwnedFd> = Vec::new();
        // One descriptor per file, not per run: a VM's scattered pages are hundreds of runs of
        // its one RAM memfd, and a message carries at most 250 descriptors.
        let mut files: Vec<(u64, u64)> = Vec::new();
        for piece in pieces {
            match piece {
                EnclaveRun::Memory { file, offset, length } => {
                    let info = sys::file_info(&file).map_err(|_| Error::Malformed)?;
                    let index = files.iter().position(|&id| id == (info.device, info.inode)).unwrap_or_else(|| {
                        files.push((info.device, info.inode));
                        fds.push(file);
                        fds.len() - 1
                    });
                    runs.push(Run { fd_index: index as u32, flags: 0, offset, length });
                }
                EnclaveRun::Hole { length } => runs.push(Run { fd_index: wire::HOLE, flags: 0, offset: 0, length }),
            }
        }
        // The same checks as an owner's answer: the runs add up, each lies inside its file.
        let answer = Answer { runs, ..Answer::ok(wire::OP_ATTACH, &[]) };
        let (runs, fds) = check_fetched(answer, fds, size)?;
        let mut answer = Answer::ok(wire::OP_ATTACH, &[0]);
        answer.runs = runs;
        Ok((answer, fds))
    }

    fn attach(&self, me: Principal, apid: u64, offset: u64, size: u64) -> Result<(Answer, Vec<OwnedFd>), Error> {
        let access = AccessId::from_raw(apid as i64).ok_or(Error::Invalid)?;
        let (plan, server) = {
            let mut state = self.lock();
            let plan = state.ns.attach(me, access, offset, size)?;
            match state.servers.get(&(plan.owner.process as u32)).cloned() {
                Some(server) => (plan, server),
                None => {
                    let _ = state.ns.detach(me, access);
                    return Err(Error::NotFound);
                }
            }
        };
        let fetched = ask_owner(&server, &Request::new(wire::OP_FETCH, &[plan.vaddr, plan.size]))
            .and_then(|(answer, fds)| check_fetched(answer, fds, plan.size));
        let (runs, fds) = match fetched {
            Ok(pair) => pair,
            Err(e) => {
                let _ = self.lock().ns.detach(me, access);
                return Err(e);
            }
        };
        self.remember_revocable(plan.owner.process as u32, &runs, &fds);
        let mut answer = Answer::ok(wire::OP_ATTACH, &[plan.segment.raw() as u64]);
        answer.runs = runs;
        Ok((answer, fds))
    }

    /// Remembers the converted memfds in an owner's answer, so they can be revoked when the
    /// owner goes.
    fn remember_revocable(&self, owner: u32, runs: &[Run], fds: &[OwnedFd]) {
        {
            let mut state = self.lock();
            if state.servers.contains_key(&owner) {
                let memfds = state.revocable.entry(owner).or_default();
                for run in runs.iter().filter(|r| r.flags & wire::RUN_REVOCABLE != 0 && r.fd_index != wire::HOLE) {
                    let fd = &fds[run.fd_index as usize];
                    if let (Ok(info), Ok(copy)) = (sys::file_info(fd), fd.try_clone()) {
                        memfds.entry((info.device, info.inode)).or_insert(copy);
                    }
                }
                // The owner's library truncates memfds it revokes or frees itself: those hold no
                // memory any more, only one of our descriptors, so let them go.
                if memfds.len() > 64 {
                    memfds.retain(|_, fd| sys::file_info(fd).map(|i| i.size > 0).unwrap_or(false));
                }
            }
        }
    }

    /// A sub-manager's part of an attach: the upstream name server asks this daemon to serve
    /// `[vaddr, vaddr + size)` of `segment`, which host process `process` made through
    /// [`Enclaves::make`]. Nothing in the request is trusted: the segment must be one this
    /// broker made upstream for that process, and the range must lie inside it. The owner's
    /// library answers as for a local attacher (memfd runs, checked the same way), and the
    /// converted memfds are remembered, so the owner's exit truncates them.
    pub fn serve_for_name_server(&self, process: u64, segment: SegmentId, vaddr: u64, size: u64) -> Result<Vec<EnclaveRun>, Error> {
        let pid = u32::try_from(process).map_err(|_| Error::Invalid)?;
        let server = {
            let state = self.lock();
            let &(owner, start, length) = state.remote_segments.get(&segment).ok_or(Error::NotFound)?;
            let end = vaddr.checked_add(size).ok_or(Error::Invalid)?;
            if owner != pid || vaddr < start || end > start.saturating_add(length) || size == 0 || size % xemem::PAGE_SIZE != 0 {
                return Err(Error::Invalid);
            }
            state.servers.get(&pid).cloned().ok_or(Error::NotFound)?
        };
        let (runs, fds) =
            ask_owner(&server, &Request::new(wire::OP_FETCH, &[vaddr, size])).and_then(|(answer, fds)| check_fetched(answer, fds, size))?;
        self.remember_revocable(pid, &runs, &fds);
        let mut pieces = Vec::with_capacity(runs.len());
        for run in &runs {
            if run.fd_index == wire::HOLE {
                pieces.push(EnclaveRun::Hole { length: run.length });
            } else {
                let file = fds.get(run.fd_index as usize).ok_or(Error::Malformed)?.try_clone().map_err(|_| Error::Exhausted)?;
                pieces.push(EnclaveRun::Memory { file, offset: run.offset, length: run.length });
            }
        }
        Ok(pieces)
    }
}

impl Broker {
    /// A sub-manager's part of a signal: the upstream name server tells this daemon that
    /// someone signalled `segment`, which host process `process` made through
    /// [`Enclaves::make`]. The segment must be one this broker made upstream for that process;
    /// its library then gets NOTIFY (its notify descriptors count one more).
    pub fn notify_for_name_server(&self, process: u64, segment: SegmentId) -> Result<(), Error> {
        let pid = u32::try_from(process).map_err(|_| Error::Invalid)?;
        let server = {
            let state = self.lock();
            match state.remote_segments.get(&segment) {
                Some(&(owner, _, _)) if owner == pid => {}
                _ => return Err(Error::NotFound),
            }
            state.servers.get(&pid).cloned().ok_or(Error::NotFound)?
        };
        ask_owner(&server, &Request::new(wire::OP_NOTIFY, &[segment.raw() as u64]))?;
        Ok(())
    }
}

/// Processes of other enclaves on host segments: clowderd's name-server node hands the broker
/// their requests about segments of enclave 1 (host processes'), since those live here. The
/// caller is `(its enclave, its process)`; permits it gets are this name server's ids.
impl Broker {
    pub fn get_for_enclave(
        &self,
        caller: Principal,
        credentials: &Credentials,
        segment: SegmentId,
        flags: u32,
    ) -> Result<(AccessId, u64), Error> {
        // Host processes come through their own connections, never here.
        if caller.enclave == NAME_SERVER_ENCLAVE {
            return Err(Error::Invalid);
        }
        xemem::validate_access_flags(flags)?;
        self.lock().ns.get(caller, credentials, segment, flags)
    }

    /// The owner's memory for `[offset, offset + size)` as the owner's library hands it over
    /// (memfd ranges and holes, checked like a host attacher's), with the segment's id.
    pub fn attach_for_enclave(
        &self,
        caller: Principal,
        access: AccessId,
        offset: u64,
        size: u64,
    ) -> Result<(SegmentId, Vec<EnclaveRun>), Error> {
        if caller.enclave == NAME_SERVER_ENCLAVE {
            return Err(Error::Invalid);
        }
        let (answer, fds) = self.attach(caller, access.raw() as u64, offset, size)?;
        let segment = SegmentId::from_raw(answer.results[0] as i64).ok_or(Error::Malformed)?;
        let mut runs = Vec::with_capacity(answer.runs.len());
        for run in &answer.runs {
            if run.fd_index == wire::HOLE {
                runs.push(EnclaveRun::Hole { length: run.length });
            } else {
                let file = fds.get(run.fd_index as usize).ok_or(Error::Malformed)?.try_clone().map_err(|_| Error::Exhausted)?;
                runs.push(EnclaveRun::Memory { file, offset: run.offset, length: run.length });
            }
        }
        Ok((segment, runs))
    }

    /// `caller` (a host process, or an enclave's process through the daemon) signals the
    /// owner of the segment its permit is on: the owner's library gets NOTIFY.
    fn signal(&self, caller: Principal, access: AccessId) -> Result<(), Error> {
        let (segment, server) = {
            let mut state = self.lock();
            let (owner, segment) = state.ns.signal(caller, access)?;
            let server = state.servers.get(&(owner.process as u32)).cloned().ok_or(Error::NotFound)?;
            (segment, server)
        };
        ask_owner(&server, &Request::new(wire::OP_NOTIFY, &[segment.raw() as u64]))?;
        Ok(())
    }

    /// An enclave's process signals the host owner of the segment its permit is on.
    pub fn signal_for_enclave(&self, caller: Principal, access: AccessId) -> Result<(), Error> {
        if caller.enclave == NAME_SERVER_ENCLAVE {
            return Err(Error::Invalid);
        }
        self.signal(caller, access)
    }

    pub fn detach_for_enclave(&self, caller: Principal, access: AccessId) -> Result<(), Error> {
        self.lock().ns.detach(caller, access)
    }

    pub fn release_for_enclave(&self, caller: Principal, access: AccessId) -> Result<(), Error> {
        self.lock().ns.release(caller, access)
    }

    /// Other enclaves' segments that `gone` selects are going (removed, their job ended,
    /// their enclave ended): each host process attached to them has its library replace the
    /// attachments with memory that raises SIGBUS, as XPMEM does after a remove. Their pages
    /// are enclave RAM, which cannot be truncated under them. Returns once every holder's
    /// library answered or [`REVOKE_WAIT`] passed for it; the permits stay until released.
    pub fn revoke_remote(&self, gone: impl Fn(SegmentId) -> bool) {
        let holders: Vec<(AccessId, Option<Server>)> = {
            let state = self.lock();
            state
                .remote_permits
                .iter()
                .filter(|(_, permit)| gone(permit.segment))
                .map(|(surrogate, permit)| (*surrogate, state.servers.get(&permit.holder).cloned()))
                .collect()
        };
        revoke_holders(holders);
    }

    /// The name server took back permit `real`, which host process `holder` holds on another
    /// enclave's segment (the owner's daemon went away, or the owner removed it): the holder's
    /// library replaces its attachments through it with memory that raises SIGBUS, as
    /// [`Broker::revoke_remote`] does. The permit stays until released. A permit this broker
    /// does not know changes nothing.
    pub fn revoke_remote_permit(&self, holder: u64, real: AccessId) {
        let found = {
            let state = self.lock();
            state
                .remote_permits
                .iter()
                .find(|(_, permit)| permit.real == real && u64::from(permit.holder) == holder)
                .map(|(surrogate, permit)| (*surrogate, state.servers.get(&permit.holder).cloned()))
        };
        revoke_holders(found.into_iter().collect());
    }

    /// A sub-manager lost the name server upstream for good (it will rejoin a new one with a
    /// new id): every segment its host processes made there is gone, and every permit they
    /// hold was granted there. Attachments through those permits are revoked (SIGBUS from
    /// then on, as after a remove), the segments can no longer be served, and a later
    /// remove or release of them succeeds here without going upstream.
    pub fn upstream_lost(&self) {
        if !self.is_sub_manager() {
            return;
        }
        // Orphaned before their holders hear of it: a holder's library cleans up (detach,
        // release) as soon as it sees SIGBUS, and those must find the permit orphaned, not
        // go to the lost name server.
        let holders: Vec<(AccessId, Option<Server>)> = {
            let mut state = self.lock();
            let segments: Vec<(SegmentId, u32)> = state.remote_segments.drain().map(|(segment, (owner, _, _))| (segment, owner)).collect();
            state.orphaned_segments.extend(segments);
            let permits: Vec<(AccessId, u32)> =
                state.remote_permits.drain().map(|(surrogate, permit)| (surrogate, permit.holder)).collect();
            let holders = permits.iter().map(|(surrogate, holder)| (*surrogate, state.servers.get(holder).cloned())).collect();
            state.orphaned_permits.extend(permits);
            holders
        };
        revoke_holders(holders);
    }

    /// An enclave is gone: its permits on host segments go too.
    pub fn forget_enclave(&self, enclave: xemem::ids::EnclaveId) {
        if enclave != NAME_SERVER_ENCLAVE {
            self.lock().ns.forget(|p| p.enclave == enclave);
        }
    }
}

/// Tells each holder's library (through its serving connection, when it has one) that its
/// attachments through the surrogate permit are revoked: they raise SIGBUS from then on.
fn revoke_holders(holders: Vec<(AccessId, Option<Server>)>) {
    for (surrogate, server) in holders {
        if let Some(server) = server {
            let _ = ask_owner_within(&server, &Request::new(wire::OP_REVOKE, &[surrogate.raw() as u64]), REVOKE_WAIT);
        }
    }
}

/// What forgetting a process leaves to do once the state lock is released.
struct Forgotten {
    pid: u32,
    /// A sub-manager's segments the process made at the name server upstream.
    upstream: Vec<SegmentId>,
    /// Other enclaves' permits on the process's segments.
    enclave_holders: Vec<(Principal, AccessId)>,
    /// Memfds its library converted, to truncate (after the enclaves let go).
    memfds: Vec<OwnedFd>,
}

static NEXT_SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// Where owners' answers are received, one per broker thread: an answer may take
    /// MAX_PACKET (128 KiB), too large to allocate, fault in and free on every attach.
    static ANSWER_BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; wire::MAX_PACKET]);
}

/// One request to an owner's serving connection and its answer (with descriptors). Each request
/// carries a fresh sequence number in its last argument, echoed in the answer's last result:
/// a late answer to a request that timed out is read and dropped, never taken for the answer
/// to a later request (which could be for another range).
fn ask_owner(server: &Server, request: &Request) -> Result<(Answer, Vec<OwnedFd>), Error> {
    ask_owner_within(server, request, Duration::MAX)
}

/// [`ask_owner`], giving up after `patience` (or the connection's own receive timeout,
/// whichever comes first) without an answer.
fn ask_owner_within(server: &Server, request: &Request, patience: Duration) -> Result<(Answer, Vec<OwnedFd>), Error> {
    let connection = server.lock().unwrap_or_else(|p| p.into_inner());
    let deadline = std::time::Instant::now().checked_add(patience);
    let sequence = NEXT_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut request = request.clone();
    request.args[wire::SEQUENCE_ARG] = sequence;
    sys::send(&connection, &request.encode(), &[]).map_err(|_| Error::NotFound)?;
    let (answer, fds) = ANSWER_BUFFER.with_borrow_mut(|buffer| loop {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !sys::wait_readable(&*connection, left).map_err(|_| Error::Malformed)? {
                return Err(Error::Unreachable);
            }
        }
        let (length, fds) = match sys::receive(&connection, buffer) {
            Ok((0, _)) => return Err(Error::NotFound), // the owner is gone
            Ok(packet) => packet,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Error::Unreachable),
            Err(_) => return Err(Error::Malformed),
        };
        let answer = Answer::decode(&buffer[..length], fds.len())?;
        if answer.results[wire::SEQUENCE_RESULT] == sequence {
            break Ok((answer, fds));
        }
        // A stale answer: its descriptors are closed as `fds` drops.
    })?;
    if answer.op != request.op {
        return Err(Error::Malformed);
    }
    if answer.errno != 0 {
        return Err(match answer.errno {
            libc::EINVAL => Error::Invalid,
            libc::EACCES => Error::Denied,
            _ => Error::NotFound,
        });
    }
    Ok((answer, fds))
}

/// The owner's runs must cover exactly the range asked for, each inside its file; the files
/// must be regular files (memfds), never sockets or devices.
fn check_fetched(answer: Answer, fds: Vec<OwnedFd>, size: u64) -> Result<(Vec<Run>, Vec<OwnedFd>), Error> {
    let mut total: u64 = 0;
    let infos: Vec<sys::FileInfo> = fds.iter().map(sys::file_info).collect::<Result<_, _>>().map_err(|_| Error::Malformed)?;
    for run in &answer.runs {
        total = total.checked_add(run.length).ok_or(Error::Malformed)?;
        if run.fd_index != wire::HOLE {
            let info = &infos[run.fd_index as usize];
            if !info.regular || run.offset + run.length > info.size {
                return Err(Error::Malformed);
            }
        }
    }
    if total != size || answer.runs.is_empty() {
        return Err(Error::Malformed);
    }
    Ok((answer.runs, fds))
}

/// Where the broker listens and libxpmem connects: `$CLOWDER_XEMEM_SOCKET`; else `xemem.sock`
/// beside the daemon's socket (`$CLOWDER_SOCKET`); else `/run/clowder/xemem.sock`.
pub fn default_socket_path() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("CLOWDER_XEMEM_SOCKET").filter(|p| !p.is_empty()) {
        return path.into();
    }
    if let Some(daemon) = std::env::var_os("CLOWDER_SOCKET") {
        if let Some(dir) = Path::new(&daemon).parent().filter(|d| !d.as_os_str().is_empty()) {
            return dir.join("xemem.sock");
        }
    }
    "/run/clowder/xemem.sock".into()
}

#[cfg(test)]
mod tests;
