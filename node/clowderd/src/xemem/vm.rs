//! XEMEM for a Linux VM (docs/xemem-pci.md): the guest has no kernel module, so this daemon
//! plays the VM's XEMEM kernel. The VMM's XEMEM PCI device checks each mailbox request and
//! sends it here (`vmm::pci::link`); this module runs the VM's own `xemem::node::Node` on a
//! link of this daemon's node, exactly as an LWK kernel runs one on its channel, so the VM's
//! segments, permits and attachments are routed, bridged and revoked by the same code as an
//! LWK enclave's.
//!
//! - **Exports**: the guest library sends its range's guest-physical runs (RUNS), then MAKE.
//!   Each export is a process of its own here (so two guest processes' equal addresses never
//!   meet), and the node resolves attaches of it from those runs; the daemon's `owner_runs`
//!   checks them against the VM's RAM.
//! - **Attaches**: the device reserves a place in its window and asks `Place`; the bridge adds
//!   the memory as regions of this VM through [`Window`], which puts them at that place
//!   (control socket `add_region` at the address). `Unplace` detaches, and the bridge keeps the
//!   regions while the permit is held, as for an LWK: the device parks the place, and the
//!   permit's next attach of the same range is placed there and takes them again (no memory
//!   slot removed and added: on PVM a removal drops the machine's shadow page tables, and each
//!   4 KiB page of a new slot faults on first touch). The permit's release, its revocation or
//!   an attach of another range through it removes them. Unlike an LWK's job, a guest process
//!   can still read kept memory (its library keeps its window mappings): the guest holds the
//!   permit and is one trust domain.
//! - **Revocation**: the node's `Revoke` is answered at once and the port removes the regions:
//!   the guest then reads all ones there (`WindowHoles`). A guest process's user-mode touch of
//!   such a placement is reported by the VMM (`Touched`, `vmm::pci::touch`): it is passed to
//!   the guest agent (`GuestEvent::Revoked`, over the enclave channel), which sends SIGBUS to
//!   the processes that attached the placement. Reports are limited here again to one per
//!   placement per `REPORT_INTERVAL` (`Limiter`), so however a guest spins on a revoked
//!   window, its agent and the channel see at most that many.
//! - **Signals** to a VM owner go to the guest agent too (`GuestEvent::Signal`), which adds one
//!   to the owner's notify eventfd (registered by libxpmem with the agent's keeper).
//!
//! Every guest process acts as the enclave's owner (its uid and groups): the guest is one
//! trust domain, and only root in it can reach the device's sysfs files.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use clowder_api::codec::{Limits, LineSocket};
use clowder_api::vmm::Piece;
use vmm::control::ControlClient;
use vmm::pci::link::{Call, HostAnswer, HostCall};
use vmm::pci::mailbox::{Op, VERSION};
use vmm::pci::touch::Limiter;
use xemem::pci::GuestEvent;
use xemem::Owner;

use super::*;
use crate::console::LogBook;

/// The one process every guest attacher is, at the name server.
const GUEST_PROCESS: u64 = 1;
/// Exports are processes from here on.
const FIRST_EXPORT_PROCESS: u64 = 1 << 32;
/// XPMEM_PERMIT_MODE, the only permit type XPMEM defines.
const PERMIT_MODE: u64 = 1;
/// Runs one export may have (4 GiB of scattered 4 KiB pages): bounds what a guest makes the
/// daemon hold.
const MAX_EXPORT_RUNS: usize = 1 << 20;
/// How long one mailbox call may take here: below the VMM's wait (`link::ANSWER_TIMEOUT`).
const CALL_DEADLINE: Duration = Duration::from_secs(7);
const PAGE: u64 = xemem::PAGE_SIZE;
/// What a VMM's call may be (a RUNS call of 4080 runs is about 200 KiB of JSON).
const LIMITS: Limits = Limits { max_line: 1 << 20, max_fds: 0, timeout: Some(Duration::from_secs(5)) };

/// Who the guest acts as.
#[derive(Clone, Debug)]
pub struct VmOwner {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// What the VM's window needs from its VMM: a memory slot at an address, removed again.
pub trait WindowSlots {
    fn add(&self, file: &File, offset: u64, len: u64, gpa: u64) -> Result<u32, String>;
    /// One slot of `pieces` of `file`, end to end (`GuestRegions::add_pieces`); `None`: a
    /// slot per piece instead.
    fn add_pieces(&self, _file: &File, _pieces: &[Piece], _gpa: u64) -> Option<Result<u32, String>> {
        None
    }
    fn remove(&self, slot: u32) -> Result<(), String>;
}

impl WindowSlots for Mutex<ControlClient> {
    fn add(&self, file: &File, offset: u64, len: u64, gpa: u64) -> Result<u32, String> {
        use clowder_api::vmm::{AddRegion, Region, VmmRequest};
        let request = VmmRequest::AddRegion(AddRegion { offset, len, gpa: Some(gpa), read_only: false });
        let (region, _): (Region, _) = self.lock().unwrap().request(&request, &[file.as_raw_fd()])?;
        Ok(region.slot)
    }

    fn add_pieces(&self, file: &File, pieces: &[Piece], gpa: u64) -> Option<Result<u32, String>> {
        use clowder_api::vmm::{AddPieces, Region, VmmRequest};
        let request = VmmRequest::AddPieces(AddPieces { pieces: pieces.to_vec(), gpa: Some(gpa), read_only: false });
        Some(self.lock().unwrap().request::<Region>(&request, &[file.as_raw_fd()]).map(|(region, _)| region.slot))
    }

    fn remove(&self, slot: u32) -> Result<(), String> {
        use clowder_api::vmm::{Region, VmmRequest};
        self.lock().unwrap().request::<Region>(&VmmRequest::RemoveRegion { slot }, &[]).map(drop)
    }
}

/// The VM's regions as the bridge adds them: at the place the device reserved for the attach
/// being served, one after the other; none outside an attach (the LWK's read-only words).
pub struct Window<'a> {
    slots: &'a dyn WindowSlots,
    /// The next address and the end of the current placement.
    cursor: Mutex<Option<(u64, u64)>>,
    added: Mutex<Vec<u32>>,
}

impl<'a> Window<'a> {
    pub fn new(slots: &'a dyn WindowSlots) -> Window<'a> {
        Window { slots, cursor: Mutex::new(None), added: Mutex::new(Vec::new()) }
    }

    fn begin(&self, gpa: u64, len: u64) {
        *self.cursor.lock().unwrap() = Some((gpa, gpa + len));
        self.added.lock().unwrap().clear();
    }

    /// Ends the placement: the slots made for it.
    fn end(&self) -> Vec<u32> {
        *self.cursor.lock().unwrap() = None;
        std::mem::take(&mut *self.added.lock().unwrap())
    }

    /// Puts `len` bytes next in the placement, as the slot `add` makes at the address given
    /// (`None` from `add`: it cannot, and nothing is placed).
    fn place(&self, len: u64, add: impl FnOnce(u64) -> Option<Result<u32, String>>) -> Option<Result<SharedRegion, String>> {
        let mut cursor = self.cursor.lock().unwrap();
        let Some((gpa, end)) = *cursor else { return Some(Err("memory for a Linux VM outside an attach".into())) };
        if len > end - gpa {
            return Some(Err(format!("{len:#x} bytes do not fit the {:#x} bytes left of the placement", end - gpa)));
        }
        let slot = match add(gpa)? {
            Ok(slot) => slot,
            Err(e) => return Some(Err(e)),
        };
        *cursor = Some((gpa + len, end));
        self.added.lock().unwrap().push(slot);
        Some(Ok(SharedRegion { slot, gpa }))
    }
}

impl GuestRegions for Window<'_> {
    fn add(&self, file: &File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String> {
        if access != RegionAccess::ReadWrite {
            return Err("a Linux VM maps no read-only words".into());
        }
        let placed = self.place(len, |gpa| Some(self.slots.add(file, offset, len, gpa)));
        placed.unwrap_or_else(|| Err("no slot was made".into()))
    }

    fn add_pieces(&self, file: &File, pieces: &[Piece]) -> Option<Result<SharedRegion, String>> {
        let len = pieces.iter().try_fold(0u64, |len, piece| len.checked_add(piece.len));
        let Some(len) = len else { return Some(Err("pieces longer than any placement".into())) };
        self.place(len, |gpa| self.slots.add_pieces(file, pieces, gpa))
    }

    fn remove(&self, slot: u32) -> Result<(), String> {
        self.slots.remove(slot)
    }
}

struct Export {
    vaddr: u64,
    size: u64,
    /// Guest-physical (address, length) runs, in the range's order.
    runs: Vec<(u64, u64)>,
}

/// The VM's side of `LocalMemory`: its exports' frames.
#[derive(Default)]
struct Exports {
    by_process: HashMap<u64, Export>,
    /// Signals for guest owners, to pass to the guest agent.
    signals: Vec<SegmentId>,
}

impl LocalMemory for Exports {
    fn resolve(&mut self, process: u64, vaddr: u64, size: u64) -> Result<Vec<FrameRun>, Error> {
        let export = self.by_process.get(&process).ok_or(Error::NotFound)?;
        let start = vaddr.checked_sub(export.vaddr).ok_or(Error::Invalid)?;
        let end = start.checked_add(size).filter(|&end| end <= export.size).ok_or(Error::Invalid)?;
        let mut frames = Vec::new();
        let mut at = 0;
        for &(gpa, len) in &export.runs {
            let (lo, hi) = (start.max(at), end.min(at + len));
            if lo < hi {
                frames.push(FrameRun { first: Some((gpa + lo - at) / PAGE), frames: (hi - lo) / PAGE });
            }
            at += len;
        }
        Ok(frames)
    }

    fn notify(&mut self, _: u64, segment: SegmentId) {
        // Bounded by what the node lets attachers send; passed on at the end of this pump.
        self.signals.push(segment);
    }

    fn revoke(&mut self, _: u64, _: AccessId) {
        // The port removes the regions once this node answers; nothing maps them here.
    }
}

/// The VM's XEMEM kernel: its node, its link to this daemon's node, and its exports.
pub struct VmXemem {
    port: XememPort,
    node: Node,
    exports: Exports,
    started: Instant,
    finished: HashMap<u64, Result<Reply, Error>>,
    /// The runs of the export being made (RUNS before MAKE).
    staged: Vec<(u64, u64)>,
    segments: HashMap<SegmentId, u64>,
    next_process: u64,
    /// Placed attachments: token, permit and the slots made for it.
    placed: HashMap<u32, (AccessId, Vec<u32>)>,
    next_token: u32,
    owner: VmOwner,
    wake: File,
    /// The guest agent, told of touches of revoked placements and of signals to guest owners.
    agent: Option<GuestAgent>,
    touches: Limiter,
    /// Events the agent could not be told (no agent, or the channel refused them).
    pub untold: u64,
}

/// Tells the guest agent one event (the enclave channel's `HostMessage::Xemem`).
pub type GuestAgent = Box<dyn Fn(GuestEvent) -> Result<(), String> + Send>;

impl VmXemem {
    /// Joins `links` for a VM whose RAM is `ram`; `None` when no link is left.
    pub fn new(links: &Arc<XememLinks>, ram: Arc<GuestRam>, owner: VmOwner) -> Result<VmXemem, String> {
        let wake = crate::sys::eventfd().map_err(|e| format!("an eventfd for the VM's XEMEM link: {e}"))?;
        let theirs = wake.try_clone().map_err(|e| format!("an eventfd for the VM's XEMEM link: {e}"))?;
        let port = links.join(ram, theirs).ok_or("no XEMEM link left for the VM")?;
        Ok(VmXemem {
            port,
            node: Node::new(1, None, Timing { retry_after: 500, attempts: 10 }),
            exports: Exports::default(),
            started: Instant::now(),
            finished: HashMap::new(),
            staged: Vec::new(),
            segments: HashMap::new(),
            next_process: FIRST_EXPORT_PROCESS,
            placed: HashMap::new(),
            next_token: 1,
            owner,
            wake,
            agent: None,
            touches: Limiter::default(),
            untold: 0,
        })
    }

    /// Passes the VM's events to its guest agent through `agent`.
    pub fn tell_agent(&mut self, agent: GuestAgent) {
        self.agent = Some(agent);
    }

    fn tell(&mut self, event: GuestEvent) -> bool {
        let told = match &self.agent {
            Some(agent) => agent(event).map_err(|e| log::warn!("xemem: telling the guest agent {event:?}: {e}")).is_ok(),
            None => false,
        };
        self.untold += u64::from(!told);
        told
    }

    /// The eventfd signalled when the daemon's node has something for this VM.
    pub fn waker(&self) -> &File {
        &self.wake
    }

    /// Moves messages both ways between the VM's node and the daemon's until neither has more.
    pub fn pump(&mut self, regions: &dyn GuestRegions) {
        crate::sys::drain_eventfd(&self.wake);
        self.port.tick(regions);
        loop {
            let incoming = self.port.to_enclave();
            for message in &incoming {
                self.node.receive(0, message, &mut self.exports);
            }
            self.node.tick(self.started.elapsed().as_millis() as u64, &mut self.exports);
            let outgoing: Vec<Message> = self.node.drain_outbox().map(|(_, message)| message).collect();
            for message in &outgoing {
                if let Ok(bytes) = message.to_bytes() {
                    self.port.from_enclave(&bytes, regions);
                }
            }
            for completion in self.node.drain_completions() {
                self.finished.insert(completion.request, completion.result);
            }
            for segment in std::mem::take(&mut self.exports.signals) {
                self.tell(GuestEvent::Signal { segid: segment.raw() });
            }
            if incoming.is_empty() && outgoing.is_empty() {
                return;
            }
        }
    }

    /// Runs `request` through the VM's node and waits for its answer.
    fn ask(&mut self, request: Request, regions: &dyn GuestRegions) -> Result<Reply, Error> {
        let deadline = Instant::now() + CALL_DEADLINE;
        let wait = |wake: &File| {
            let mut poll = libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd for a descriptor this VM holds.
            unsafe { libc::poll(&mut poll, 1, 5) };
        };
        while self.node.id().is_none() {
            self.pump(regions);
            if Instant::now() > deadline {
                return Err(Error::Unreachable);
            }
            if self.node.id().is_none() {
                wait(&self.wake);
            }
        }
        let id = self.node.request(request, &mut self.exports)?;
        loop {
            self.pump(regions);
            if let Some(result) = self.finished.remove(&id) {
                return result;
            }
            if Instant::now() > deadline {
                return Err(Error::Unreachable);
            }
            wait(&self.wake);
        }
    }

    fn credentials(&self) -> Credentials {
        Credentials { uid: self.owner.uid, groups: self.owner.groups.clone() }
    }

    /// One call of the VMM: up to four results, or an errno value.
    pub fn serve(&mut self, call: Call, window: &Window<'_>) -> Result<[u64; 4], i32> {
        match call {
            Call::Request { op, args, name, runs } => self.request(Op::from_u32(op).ok_or(libc::ENOSYS)?, args, name, runs, window),
            Call::Place { apid, offset, len, gpa } => self.place(access_id(apid)?, offset, len, gpa, window),
            // Once a placement per interval; the VMM saw the touch (user mode, inside a placement
            // the guest still has attached, with no memory there any more).
            Call::Touched { token, window_offset } => {
                if !self.placed.contains_key(&token) {
                    return Err(libc::EINVAL);
                }
                let told = self.touches.allow(u64::from(token), Instant::now()) && self.tell(GuestEvent::Revoked { window_offset });
                Ok([u64::from(told), 0, 0, 0])
            }
            // Answered 1: the bridge keeps the regions at the place (the module comment says
            // until when), and the device keeps the place for them.
            Call::Unplace { token } => {
                self.touches.forget(u64::from(token));
                let (access, slots) = self.placed.remove(&token).ok_or(libc::EINVAL)?;
                match self.ask(Request::Detach { process: GUEST_PROCESS, access }, window) {
                    Ok(_) => Ok([1, 0, 0, 0]),
                    Err(error) => {
                        for slot in slots {
                            // Gone already when the attachment was revoked.
                            let _ = window.remove(slot);
                        }
                        Err(error.errno())
                    }
                }
            }
        }
    }

    fn request(
        &mut self,
        op: Op,
        args: [u64; 6],
        name: Option<String>,
        runs: Vec<(u64, u64)>,
        window: &Window<'_>,
    ) -> Result<[u64; 4], i32> {
        let name = name.map(|name| Name::new(name.as_bytes()).map_err(Error::errno)).transpose()?;
        let reply = match op {
            Op::Hello => return Ok([u64::from(VERSION), 0, 0, 0]),
            Op::Runs => {
                if args[0] == 0 {
                    self.staged.clear();
                }
                if args[0] != self.staged.len() as u64 || self.staged.len() + runs.len() > MAX_EXPORT_RUNS {
                    return Err(libc::EINVAL);
                }
                if runs.iter().any(|&(gpa, len)| gpa % PAGE != 0 || len % PAGE != 0 || len == 0 || gpa.checked_add(len).is_none()) {
                    return Err(libc::EINVAL);
                }
                self.staged.extend(runs);
                return Ok([0; 4]);
            }
            Op::Make => {
                let [vaddr, size, permit_type, permit_value, total, _] = args;
                let staged = std::mem::take(&mut self.staged);
                let covered = staged.iter().try_fold(0u64, |sum, &(_, len)| sum.checked_add(len));
                if permit_type != PERMIT_MODE || total != staged.len() as u64 || covered != Some(size) {
                    return Err(libc::EINVAL);
                }
                let process = self.next_process;
                self.next_process += 1;
                self.exports.by_process.insert(process, Export { vaddr, size, runs: staged });
                let owner = Owner { uid: self.owner.uid, gid: self.owner.gid, mode: (permit_value & 0o777) as u32 };
                match self.ask(Request::Make { process, vaddr, size, owner, name }, window) {
                    Ok(Reply::Made(segment)) => {
                        self.segments.insert(segment, process);
                        return Ok([segment.raw() as u64, 0, 0, 0]);
                    }
                    other => {
                        self.exports.by_process.remove(&process);
                        other
                    }
                }
            }
            Op::Remove => {
                let segment = segment_id(args[0])?;
                let process = *self.segments.get(&segment).ok_or(libc::ENOENT)?;
                let removed = self.ask(Request::Remove { process, segment }, window);
                if removed.is_ok() {
                    self.segments.remove(&segment);
                    self.exports.by_process.remove(&process);
                }
                removed
            }
            Op::Get => {
                let request = Request::Get {
                    process: GUEST_PROCESS,
                    segment: segment_id(args[0])?,
                    access: u32::try_from(args[1]).map_err(|_| libc::EINVAL)?,
                    credentials: self.credentials(),
                };
                match self.ask(request, window) {
                    Ok(Reply::Granted { access, .. }) => return Ok([access.raw() as u64, 0, 0, 0]),
                    other => other,
                }
            }
            Op::Release => self.ask(Request::Release { process: GUEST_PROCESS, access: access_id(args[0])? }, window),
            Op::Signal => self.ask(Request::Signal { process: GUEST_PROCESS, access: access_id(args[0])? }, window),
            Op::Lookup => match self.ask(Request::Lookup { name: name.ok_or(libc::EINVAL)? }, window) {
                Ok(Reply::Found(segment)) => return Ok([segment.raw() as u64, 0, 0, 0]),
                other => other,
            },
            // The device itself turns these into `Place` and `Unplace`.
            Op::Attach | Op::Detach => return Err(libc::EINVAL),
        };
        match reply {
            Ok(Reply::Done) => Ok([0; 4]),
            Ok(_) => Err(libc::EPROTO),
            Err(error) => Err(error.errno()),
        }
    }

    /// ATTACH: the memory of permit `access` from `offset` at `[gpa, gpa + len)` of the window.
    fn place(&mut self, access: AccessId, offset: u64, len: u64, gpa: u64, window: &Window<'_>) -> Result<[u64; 4], i32> {
        if len == 0 || len % PAGE != 0 || offset % PAGE != 0 || gpa % PAGE != 0 || gpa.checked_add(len).is_none() {
            return Err(libc::EINVAL);
        }
        window.begin(gpa, len);
        let attached = self.ask(Request::Attach { process: GUEST_PROCESS, access, offset, size: len }, window);
        let slots = window.end();
        let runs = match attached {
            Ok(Reply::Attached { runs, .. }) => runs,
            Ok(_) => Vec::new(),
            Err(error) => {
                for slot in slots {
                    let _ = window.remove(slot);
                }
                return Err(error.errno());
            }
        };
        // The memory must be exactly the placement: anything else (the VM's own export, whose
        // frames are its RAM; a permit attached before and kept elsewhere) is not mapped there.
        if !contiguous_from(&runs, gpa, len) {
            let _ = self.ask(Request::Detach { process: GUEST_PROCESS, access }, window);
            for slot in slots {
                let _ = window.remove(slot);
            }
            return Err(libc::EBUSY);
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        self.placed.insert(token, (access, slots));
        Ok([u64::from(token), 0, 0, 0])
    }
}

/// Whether `runs` are frames covering `[gpa, gpa + len)` in order.
fn contiguous_from(runs: &[FrameRun], gpa: u64, len: u64) -> bool {
    let mut next = gpa / PAGE;
    for run in runs {
        if run.first != Some(next) {
            return false;
        }
        next += run.frames;
    }
    next == (gpa + len) / PAGE
}

fn segment_id(raw: u64) -> Result<SegmentId, i32> {
    SegmentId::from_raw(raw as i64).ok_or(libc::EINVAL)
}

fn access_id(raw: u64) -> Result<AccessId, i32> {
    AccessId::from_raw(raw as i64).ok_or(libc::EINVAL)
}

/// A call in a log line (a RUNS call's runs counted, not listed).
fn describe(call: &Call) -> String {
    match call {
        Call::Request { op, args, runs, .. } => match Op::from_u32(*op) {
            Some(Op::Runs) => format!("RUNS from {} ({} runs)", args[0], runs.len()),
            Some(op) => format!("{op:?}"),
            None => format!("op {op}"),
        },
        other => format!("{other:?}"),
    }
}

/// Where a Linux enclave's VMM listens for its XEMEM device, and its control socket.
#[derive(Clone, Debug)]
pub struct VmSockets {
    pub mailbox: PathBuf,
    pub control: PathBuf,
}

/// Serves a Linux enclave's XEMEM device on a thread until its VMM closes the mailbox socket
/// (the VM ended): then the VM's link goes down, and everything attached of its segments
/// elsewhere is revoked.
pub fn start(
    links: Arc<XememLinks>,
    ram: Arc<GuestRam>,
    sockets: VmSockets,
    owner: VmOwner,
    agent: GuestAgent,
    log: Arc<LogBook>,
) -> Result<(), String> {
    let stream = std::os::unix::net::UnixStream::connect(&sockets.mailbox)
        .map_err(|e| format!("the VMM's XEMEM mailbox socket {}: {e}", sockets.mailbox.display()))?;
    let control =
        ControlClient::connect(&sockets.control).map_err(|e| format!("the VMM's control socket {}: {e}", sockets.control.display()))?;
    let mut vm = VmXemem::new(&links, ram, owner)?;
    vm.tell_agent(agent);
    std::thread::Builder::new()
        .name("xemem-vm".into())
        .spawn(move || {
            let control = Mutex::new(control);
            let window = Window::new(&control);
            let mut socket = LineSocket::new(stream, LIMITS);
            if let Some(why) = serve_forever(&mut vm, &mut socket, &window, &log) {
                log.push(format!("clowderd: xemem: the VM's XEMEM device stopped: {why}"));
            }
        })
        .map_err(|e| format!("starting the VM's XEMEM thread: {e}"))?;
    Ok(())
}

/// Answers the VMM's calls and keeps the VM's node moving; returns why it stopped (`None`:
/// the VMM closed the socket).
pub fn serve_forever(vm: &mut VmXemem, socket: &mut LineSocket, window: &Window<'_>, log: &LogBook) -> Option<String> {
    loop {
        let mut polls = [
            libc::pollfd { fd: socket.stream().as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: vm.waker().as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two pollfds for descriptors held above.
        unsafe { libc::poll(polls.as_mut_ptr(), 2, 50) };
        vm.pump(window);
        if polls[0].revents == 0 {
            continue;
        }
        match socket.receive_json::<HostCall>() {
            Ok(Some((call, _))) => {
                let what = describe(&call.what);
                let started = Instant::now();
                let result = vm.serve(call.what, window);
                log.push(format!("clowderd: xemem: the VM's {what}: {result:?} in {:.1} ms", started.elapsed().as_secs_f64() * 1e3));
                if let Err(e) = socket.send(&HostAnswer { seq: call.seq, result }, &[]) {
                    return Some(format!("answering the VMM: {e}"));
                }
            }
            Ok(None) => return None,
            // A VMM that sends garbage is out of step: the device goes (its guest's calls then
            // fail with ENODEV), the VM and the daemon go on.
            Err(e) => return Some(format!("a malformed call from the VMM: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot made: its (offset, length) pieces and its address.
    type Made = (Vec<(u64, u64)>, u64);

    /// Slots as made; `pieces` says whether it makes slots of pieces.
    #[derive(Default)]
    struct Slots {
        made: Mutex<Vec<Made>>,
        pieces: bool,
    }

    impl WindowSlots for Slots {
        fn add(&self, _file: &File, offset: u64, len: u64, gpa: u64) -> Result<u32, String> {
            let mut made = self.made.lock().unwrap();
            made.push((vec![(offset, len)], gpa));
            Ok(made.len() as u32)
        }
        fn add_pieces(&self, _file: &File, pieces: &[Piece], gpa: u64) -> Option<Result<u32, String>> {
            let mut made = self.made.lock().unwrap();
            self.pieces.then(|| {
                made.push((pieces.iter().map(|piece| (piece.offset, piece.len)).collect(), gpa));
                Ok(made.len() as u32)
            })
        }
        fn remove(&self, _slot: u32) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn pieces_go_next_in_the_placement_as_one_slot() {
        let file = crate::sys::memfd("window-pieces-test").unwrap();
        let pieces = [Piece { offset: 5 * PAGE, len: PAGE }, Piece { offset: 0, len: 2 * PAGE }];
        let slots = Slots { pieces: true, ..Slots::default() };
        let window = Window::new(&slots);
        assert!(matches!(window.add_pieces(&file, &pieces), Some(Err(_))), "outside an attach");
        window.begin(1 << 32, 5 * PAGE);
        let region = window.add_pieces(&file, &pieces).unwrap().unwrap();
        assert_eq!(region, SharedRegion { slot: 1, gpa: 1 << 32 });
        let next = window.add(&file, 9 * PAGE, PAGE, RegionAccess::ReadWrite).unwrap();
        assert_eq!(next.gpa, (1 << 32) + 3 * PAGE, "after the pieces' three pages");
        // One page is left: three do not fit, and nothing is made.
        assert!(matches!(window.add_pieces(&file, &pieces), Some(Err(e)) if e.contains("do not fit")));
        assert_eq!(window.end(), vec![1, 2]);
        let made = slots.made.lock().unwrap().clone();
        assert_eq!(made, vec![(vec![(5 * PAGE, PAGE), (0, 2 * PAGE)], 1 << 32), (vec![(9 * PAGE, PAGE)], (1 << 32) + 3 * PAGE)]);
        // Slots that take no pieces: nothing is placed, and the bridge adds a region per piece.
        let slots = Slots::default();
        let window = Window::new(&slots);
        window.begin(1 << 32, 5 * PAGE);
        assert!(window.add_pieces(&file, &pieces).is_none());
        assert_eq!(window.add(&file, 0, PAGE, RegionAccess::ReadWrite).unwrap().gpa, 1 << 32);
    }
}
