//! `/dev/xpmem`: XPMEM's kernel interface inside the lightweight kernel, so the same statically
//! linked program (built against `xemem/include/xpmem.h` and `libxpmem.a`) shares memory here
//! as it does on the host through clowderd's broker.
//!
//! Connected to clowderd (a persistent enclave), every segment, permit and id is the host's name
//! server's (`host_link`): segids are unique machine-wide and any enclave or host process may
//! use any of them. Standalone, the enclave is its own name server and serves segments within
//! the enclave: the job is the only process, so an owner and its attachers are the job's
//! threads (or the same thread). Either way the rules (ids, checks, errnos) are the `xemem`
//! crate's name server, the very code the host broker runs, so all backends answer alike. What
//! the kernel adds is memory:
//! - a segment range resolves to runs of frames read from the job's page tables (`resolve`),
//!   with holes where nothing is mapped;
//! - an attachment maps those runs into a window of the job's address space that the job's
//!   own memory (image, heap, stack) never uses; holes stay unmapped;
//! - every page fault inside an attachment (a hole, a removed segment, a write to a read-only
//!   source page) is SIGBUS, as XPMEM gives.
//!
//! Ioctl numbers and argument layouts are XPMEM's (x86-64), as `xpmem.h` publishes them.

mod commands;
pub mod host_link;
mod notify;
mod parking;
mod snapshot;

use crate::arch::paging::{Protection, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::sync::SpinLock;
use crate::job;
use crate::sched::WaitResult;
use crate::signal::Restart;
use crate::syscall::{user, Errno, Fd, SyscallResult, UserAddr};
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use xemem::ids::{AccessId, SegmentId};
use xemem::node::{Reply, Request};
use xemem::{Credentials, Error, NameServer, Owner, Principal};

pub use commands::{ioctl, parking};
use notify::NOTIFIERS;
pub use notify::{notifier_of, notify, read_notifier, signal, Notifier};
use parking::{drop_parked_in_the_way, drop_parked_where, may_park, park, readable_word, DeviceDescriptor};
pub use parking::{park_detached, resume_same};
pub use snapshot::copy_on_write;

/// The path the job opens; `libxpmem` switches to its ioctl backend when it opens.
pub const DEVICE_PATH: &str = "/dev/xpmem";

/// Attachments live here: above any heap the loader can place (the heap starts just above the
/// image, below 0x5600_0000_0000 for any RAM size an enclave gets) and below the stack
/// (which ends at 0x7fff_ffe0_0000 and is at most a few GiB); snapshot regions lie above.
const ATTACH_WINDOW_START: u64 = 0x7000_0000_0000;
const ATTACH_WINDOW_END: u64 = snapshot::REGION_WINDOW_START;
const GIGABYTE: u64 = 1 << 30;

/// This enclave as its own name server knows it, standalone (enclave 1, as in XEMEM);
/// connected, its segments carry the id the host's name server handed out.
const LOCAL_ENCLAVE: xemem::ids::EnclaveId = xemem::ids::NAME_SERVER_ENCLAVE;

/// The job runs as root inside its enclave (see `syscall/identity.rs`): segments are owned by
/// uid 0 and every request carries uid 0, so the mode never refuses (SysV's rule for root).
const JOB_UID: u32 = 0;
const JOB_GID: u32 = 0;

/// A piece of a resolved range: `first` physical frame (None: a hole) and whether the
/// source maps it writable. Consecutive pages share a run while they are physically
/// contiguous and equally writable, so the cost follows the number of runs, not pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceRun {
    pub first: Option<u64>,
    pub frames: u64,
    pub writable: bool,
}

struct Attachment {
    /// The process whose address space holds it (each process of the job has its own).
    pid: u64,
    start: u64,
    end: u64,
    access: AccessId,
    /// The segment attached: removing it revokes the attachment.
    segment: SegmentId,
    /// The segment was removed: the pages are gone, the range stays reserved (and faults
    /// SIGBUS) until the job detaches it.
    revoked: bool,
    /// Made through a permit of the host's name server: detaching it tells the host (after
    /// the mapping here is gone), which removes any guest-physical regions it added for it.
    global: bool,
    /// Where in the segment it starts.
    offset: u64,
    /// Placed alone in its GiBs (nothing else of the process is mapped in them), so its tables
    /// can be suspended as a whole: memory the host added, attached through a global permit.
    alone: bool,
    /// Detached by the job, but parked: see [`park`].
    parked: bool,
    /// The host's word for it: (guest-physical address, value) of a word that holds the value
    /// while the host's answer holds (see [`may_park`]).
    valid_while: Option<(u64, u64)>,
}

impl Attachment {
    /// The range no other attachment may take: its GiBs when it is alone in them.
    fn reserved(&self) -> (u64, u64) {
        if self.alone {
            (self.start & !(GIGABYTE - 1), self.end.next_multiple_of(GIGABYTE))
        } else {
            (self.start, self.end)
        }
    }
}

/// A permit the host's name server granted.
#[derive(Clone, Copy)]
struct GlobalPermit {
    /// The process that took it (the XEMEM process the name server knows as its holder).
    pid: u64,
    flags: u32,
    segment: SegmentId,
    /// Taken here for one more attachment through this permit of the job's (see
    /// [`attach_through_own_permit`]): released with that attachment's detach.
    extra_of: Option<AccessId>,
}

struct Device {
    /// The enclave's own name server, standalone.
    names: NameServer,
    /// Permits from the host's name server, by id.
    global_permits: BTreeMap<i64, GlobalPermit>,
    /// Segments the job's processes made through the host's name server: id -> (owner pid,
    /// vaddr, length), so that an attach of them maps the owner's pages from its page tables.
    own_segments: BTreeMap<SegmentId, (u64, u64, u64)>,
    /// Sorted by `start`, never overlapping.
    attachments: Vec<Attachment>,
}

static DEVICE: SpinLock<Option<Device>> = SpinLock::new(None);

/// Runs `f` on process `pid` of the job (also from the channel's interrupt, which may come
/// while another process runs); `None` when it is gone.
fn with_job_process<R>(pid: u64, f: impl FnOnce(&mut job::Process) -> R) -> Option<R> {
    job::with_process_of(pid, f)
}

/// The calling process: every process of the job is an XEMEM process of its own (its pid),
/// with its own segments, permits and attachments.
fn caller() -> u64 {
    crate::sched::current_pid()
}

fn principal(pid: u64) -> Principal {
    Principal { enclave: LOCAL_ENCLAVE, process: pid }
}

fn job_credentials() -> Credentials {
    Credentials { uid: JOB_UID, groups: alloc::vec![JOB_GID] }
}

fn with_device<R>(f: impl FnOnce(&mut Device) -> R) -> R {
    let mut device = DEVICE.lock();
    f(device.get_or_insert_with(|| Device {
        // Each job's ids start somewhere else, as on the host (ids of an earlier job's
        // segments are not found).
        names: NameServer::new(crate::arch::cpu::rdrand().unwrap_or_else(crate::arch::cpu::read_tsc)),
        global_permits: BTreeMap::new(),
        own_segments: BTreeMap::new(),
        attachments: Vec::new(),
    }))
}

/// The job ended: its segments, permits and attachments go with its address spaces.
pub fn forget_job() {
    let device = DEVICE.lock().take();
    NOTIFIERS.lock().clear();
    snapshot::forget_job(crate::enclave::zero_memory);
    let Some(device) = device else { return host_link::job_ended(Vec::new(), Vec::new()) };
    let segments = device.own_segments.iter().map(|(segment, owner)| (owner.0, *segment)).collect();
    let permits = device.global_permits.iter().filter_map(|(raw, permit)| Some((permit.pid, AccessId::from_raw(*raw)?))).collect();
    host_link::job_ended(segments, permits);
}

/// Process `pid` (not the job's first: its end is the job's) is ending, or replacing its
/// image, its address space still whole: its segments are removed and their attachments in
/// the job's other processes revoked (SIGBUS from now on) before its memory is freed; its own
/// attachments and permits go. Segments of the host's name server are removed there, and this
/// returns once the daemon has revoked their attachments in host processes and other enclaves
/// (`host_link::process_ended`); their permits are released without waiting. Returns false
/// when the name server did not answer some remove: the memory must then not be reused while
/// the job runs (`job::keep_until_job_ends`).
pub fn process_ended(pid: u64) -> bool {
    let (unmapped, segments, permits) = {
        let mut guard = DEVICE.lock();
        let Some(device) = guard.as_mut() else { return true };
        let global: Vec<SegmentId> = device.own_segments.iter().filter(|(_, owner)| owner.0 == pid).map(|(id, _)| *id).collect();
        for id in &global {
            device.own_segments.remove(id);
        }
        let local: Vec<SegmentId> = device.names.forget(|p| *p == principal(pid)).iter().map(|segment| segment.id).collect();
        let permits: Vec<(u64, AccessId)> = device
            .global_permits
            .iter()
            .filter(|(_, permit)| permit.pid == pid)
            .filter_map(|(raw, _)| Some((pid, AccessId::from_raw(*raw)?)))
            .collect();
        for (_, access) in &permits {
            device.global_permits.remove(&access.raw());
        }
        // Its own attachments go with its address space (nothing to unmap).
        device.attachments.retain(|a| a.pid != pid);
        let unmapped = revoke_where(device, |a| (a.global && global.contains(&a.segment)) || (!a.global && local.contains(&a.segment)));
        (unmapped, global, permits)
    };
    {
        let mut notifiers = NOTIFIERS.lock();
        notifiers.retain(|_, notifier| notifier.owner != pid);
    }
    if unmapped {
        crate::sched::shoot_down_user_tlbs();
    }
    let removed = host_link::process_ended(pid, segments, permits);
    // Snapshot frames a remove left unanswered may still be mapped elsewhere: kept till the
    // job ends.
    if removed {
        snapshot::process_ended(pid);
    }
    removed
}

/// Does a user fault at `address` hit an attachment of the faulting process? Then it gets
/// SIGBUS, not SIGSEGV.
pub fn is_attachment_fault(address: u64) -> bool {
    // Only user-mode faults come here, and a CPU returns to user mode with no lock held, so
    // this CPU cannot hold the lock. Another CPU may (a revoke unmapping this very range): wait
    // for it, or the fault would be taken for a SIGSEGV.
    let pid = caller();
    DEVICE
        .lock()
        .as_ref()
        .is_some_and(|device| device.attachments.iter().any(|a| a.pid == pid && !a.parked && a.start <= address && address < a.end))
}

/// Ranges resolved lately, with the address space (its never-reused id) and its count of
/// changes when they were read: an owner attached again and again (an analytics code
/// attaching its simulation's data at every step) is answered without walking the tables,
/// which is emulated work on PVM (about 4 ms per GiB of 2 MiB pages).
struct ResolvedRange {
    aspace: u64,
    changes: u64,
    vaddr: u64,
    size: u64,
    runs: Vec<SourceRun>,
}

const RESOLVED_KEPT: usize = 4;
static RESOLVED: SpinLock<Vec<ResolvedRange>> = SpinLock::new(Vec::new());

/// Frames behind `[vaddr, vaddr + size)` of process `pid`, as runs (holes where nothing is
/// mapped). `None` when the process is gone.
pub fn resolve(pid: u64, vaddr: u64, size: u64) -> Option<Vec<SourceRun>> {
    with_job_process(pid, |process| {
        let (aspace, _) = process.memory.aspace.handle();
        let changes = process.memory.aspace.changes();
        let same = |range: &ResolvedRange| range.aspace == aspace && range.vaddr == vaddr && range.size == size;
        let mut resolved = RESOLVED.lock();
        if let Some(range) = resolved.iter().find(|range| same(range) && range.changes == changes) {
            return range.runs.clone();
        }
        let runs = resolve_from_tables(process, vaddr, size);
        resolved.retain(|range| !same(range));
        if resolved.len() == RESOLVED_KEPT {
            resolved.remove(0);
        }
        resolved.push(ResolvedRange { aspace, changes, vaddr, size, runs: runs.clone() });
        runs
    })
}

fn resolve_from_tables(process: &mut job::Process, vaddr: u64, size: u64) -> Vec<SourceRun> {
    let end = vaddr + size;
    let mut runs: Vec<SourceRun> = Vec::new();
    let mut add = |first: Option<u64>, writable: bool, bytes: u64| {
        let frames = bytes / PAGE_SIZE;
        match runs.last_mut() {
            Some(last)
                if last.writable == writable
                    && match (last.first, first) {
                        (None, None) => true,
                        (Some(previous), Some(next)) => previous + last.frames == next,
                        _ => false,
                    } =>
            {
                last.frames += frames
            }
            _ => runs.push(SourceRun { first, frames, writable }),
        }
    };
    // One walk of the range's tables (each read of a table is slow on PVM); what no leaf
    // covers is a hole, found by whole missing tables (a whole-address-space segment is
    // 128 TiB).
    let mut covered = vaddr;
    process.memory.aspace.for_each_run_in(vaddr, end, |start, physical, length, protection| {
        let (from, to) = (start.max(vaddr), (start + length).min(end));
        if from >= to {
            return;
        }
        if from > covered {
            add(None, false, from - covered);
        }
        add(Some((physical + (from - start)) / PAGE_SIZE), protection.write, to - from);
        covered = to;
    });
    if covered < end {
        add(None, false, end - covered);
    }
    runs
}

/// Where an attachment of `size` bytes whose first frame is `first_physical` goes in process
/// `pid`: the lowest gap of the window, placed so that virtual and physical addresses agree
/// modulo 2 MiB (the attachment then gets 2 MiB pages wherever the source has contiguous
/// 2 MiB blocks). An attachment `alone` starts in a GiB of its own and keeps the rest of its
/// last GiB free (see [`park`]).
fn place(attachments: &[Attachment], pid: u64, size: u64, first_physical: u64, alone: bool) -> Option<u64> {
    // 1 GiB pages for an attachment of a GiB or more (one table entry per GiB to write),
    // 2 MiB pages from 2 MiB on.
    let leaf = [GIGABYTE, HUGE_PAGE_SIZE].into_iter().find(|leaf| size >= *leaf).unwrap_or(1);
    let align = if alone { GIGABYTE } else { leaf };
    let phase = first_physical % leaf;
    let fit_from = |from: u64| if align > 1 { from.next_multiple_of(align) + phase } else { from };
    let mut candidate = fit_from(ATTACH_WINDOW_START);
    loop {
        let end = candidate.checked_add(size)?;
        let wanted = if alone { (candidate & !(GIGABYTE - 1), end.next_multiple_of(GIGABYTE)) } else { (candidate, end) };
        let in_the_way = attachments
            .iter()
            .filter(|a| a.pid == pid)
            .map(Attachment::reserved)
            .filter(|&(start, end)| start < wanted.1 && wanted.0 < end)
            .map(|(_, end)| end)
            .max();
        match in_the_way {
            Some(end) => candidate = fit_from(end),
            None => return (wanted.1 <= ATTACH_WINDOW_END).then_some(candidate),
        }
    }
}

fn segment_id(raw: i64) -> Result<SegmentId, Error> {
    if raw <= 0 {
        return Err(Error::Invalid);
    }
    // Positive but not a well-formed id (enclave part 0, say): EINVAL, as the host's broker.
    SegmentId::from_raw(raw).ok_or(Error::Invalid)
}

fn access_id(raw: i64) -> Result<AccessId, Error> {
    if raw <= 0 {
        return Err(Error::Invalid);
    }
    AccessId::from_raw(raw).ok_or(Error::Invalid)
}

/// Whether the enclave's segments and permits are the host's name server's.
fn connected() -> bool {
    host_link::enclave_id().is_some()
}

/// Makes a segment with the host's name server; its id names this enclave.
fn make_global(pid: u64, vaddr: u64, size: u64, owner: Owner, name: Option<xemem::wire::Name>) -> Result<i64, Error> {
    let length = xemem::nameserver::validate_range(vaddr, size)?;
    match host_link::direct(Request::Make { process: pid, vaddr, size, owner, name })? {
        Reply::Made(segment) => {
            with_device(|device| device.own_segments.insert(segment, (pid, vaddr, length)));
            Ok(segment.raw())
        }
        _ => Err(Error::Malformed),
    }
}

/// XEMEM's named make (mode 0666, as XEMEM's global segments).
pub fn make_named(vaddr: u64, size: u64, name: xemem::wire::Name) -> Result<i64, Error> {
    make_segment(caller(), vaddr, size, 0o666, Some(name))
}

/// A segment of process `pid` with the host's name server when connected, else the
/// enclave's own. Over a snapshot region whose snapshot is out it is refused (EBUSY, as on the
/// host): its attachers would map pages the writer is leaving for copies; over one between
/// snapshots the region is made writable throughout first.
fn make_segment(pid: u64, vaddr: u64, size: u64, mode: u32, name: Option<xemem::wire::Name>) -> Result<i64, Error> {
    snapshot::unprotect_for_export(pid, vaddr, size)?;
    let owner = Owner { uid: JOB_UID, gid: JOB_GID, mode };
    if connected() {
        return make_global(pid, vaddr, size, owner, name);
    }
    with_device(|device| device.names.make(principal(pid), vaddr, size, owner, name)).map(SegmentId::raw)
}

pub fn make(vaddr: u64, size: u64, permit_type: u32, mode: u64) -> Result<i64, Error> {
    if permit_type != commands::PERMIT_MODE || mode > xemem::perm::MAX_MODE as u64 {
        return Err(Error::Invalid);
    }
    make_segment(caller(), vaddr, size, mode as u32, None)
}

/// `xemem_snapshot_make` on the device: the caller's region at `start` published as a
/// read-only snapshot segment with mode `mode` (XPMEM's permit) and, if given, a name.
pub fn snapshot_make(start: u64, permit_type: u32, mode: u64, name: Option<xemem::wire::Name>) -> Result<i64, Errno> {
    if permit_type != commands::PERMIT_MODE || mode > xemem::perm::MAX_MODE as u64 {
        return Err(Errno::EINVAL);
    }
    let pid = caller();
    snapshot::snapshot_make(start, |shadow, size| make_segment(pid, shadow, size, mode as u32, name))
}

pub use snapshot::{region_alloc, region_free, snapshot_release};

/// Unmaps the attachments `which` selects (in whichever process holds them) and keeps their
/// ranges reserved (that process's next touch is SIGBUS, until it detaches them). Returns
/// whether any was mapped.
fn revoke_where(device: &mut Device, which: impl Fn(&Attachment) -> bool) -> bool {
    // Parked ones were detached by the job already: they go for good.
    drop_parked_where(device, &which);
    let mut unmapped = false;
    for attachment in device.attachments.iter_mut().filter(|a| !a.revoked && which(a)) {
        attachment.revoked = true;
        let _ =
            with_job_process(attachment.pid, |process| process.memory.aspace.unmap(attachment.start, attachment.end - attachment.start));
        unmapped = true;
    }
    unmapped
}

/// Removes a segment; attachments made through it lose their pages (SIGBUS from now on).
pub fn remove(raw: i64) -> Result<(), Error> {
    let pid = caller();
    let id = segment_id(raw)?;
    let global = host_link::enclave_id().is_some_and(|enclave| enclave == id.enclave());
    if global {
        host_link::direct(Request::Remove { process: pid, segment: id })?;
    }
    // Unmapped under the device lock, so no attach can take the range in between.
    let unmapped = with_device(|device| {
        if global {
            device.own_segments.remove(&id);
        } else {
            device.names.remove(principal(pid), id)?;
        }
        Ok(revoke_where(device, |a| a.global == global && a.segment == id))
    })?;
    NOTIFIERS.lock().remove(&id);
    if unmapped {
        crate::sched::shoot_down_user_tlbs();
    }
    Ok(())
}

pub fn get(raw: i64, flags: u32, permit_type: u32, permit_value: u64) -> Result<i64, Error> {
    // XPMEM's kernel takes only PERMIT_MODE and a NULL permit value here (the library never
    // sends the value it was given).
    if permit_type != commands::PERMIT_MODE || permit_value != 0 {
        return Err(Error::Invalid);
    }
    xemem::validate_access_flags(flags)?;
    let pid = caller();
    let id = segment_id(raw)?;
    if !connected() {
        return with_device(|device| device.names.get(principal(pid), &job_credentials(), id, flags)).map(|(apid, _)| apid.raw());
    }
    match host_link::direct(Request::Get { process: pid, segment: id, access: flags, credentials: job_credentials() })? {
        Reply::Granted { access, .. } => {
            with_device(|device| device.global_permits.insert(access.raw(), GlobalPermit { pid, flags, segment: id, extra_of: None }));
            Ok(access.raw())
        }
        _ => Err(Error::Malformed),
    }
}

/// The caller's global permit `apid`, if it holds one.
fn held_global(device: &Device, pid: u64, apid: AccessId) -> Option<GlobalPermit> {
    device.global_permits.get(&apid.raw()).copied().filter(|permit| permit.pid == pid)
}

pub fn release(raw: i64) -> Result<(), Error> {
    let pid = caller();
    let apid = access_id(raw)?;
    // The host removes any regions behind the permit's attachments: unmap them here first.
    // Touching them afterwards faults (SIGBUS), as after a remove.
    let global = with_device(|device| {
        if held_global(device, pid, apid).is_none() {
            return Err(device.names.release(principal(pid), apid));
        }
        device.global_permits.remove(&apid.raw());
        // The permits taken for its further attachments go with it.
        let extras: Vec<AccessId> = device
            .global_permits
            .iter()
            .filter(|(_, permit)| permit.pid == pid && permit.extra_of == Some(apid))
            .filter_map(|(raw, _)| AccessId::from_raw(*raw))
            .collect();
        let mut unmapped = forget_attachments(device, pid, apid);
        for extra in &extras {
            device.global_permits.remove(&extra.raw());
            unmapped |= forget_attachments(device, pid, *extra);
        }
        Ok((unmapped, extras))
    });
    match global {
        Err(local) => local,
        Ok((unmapped, extras)) => {
            if unmapped {
                crate::sched::shoot_down_user_tlbs();
            }
            for extra in extras {
                let _ = host_link::direct(Request::Release { process: pid, access: extra });
            }
            host_link::direct(Request::Release { process: pid, access: apid }).map(drop)
        }
    }
}

/// Unmaps and forgets the attachments process `pid` made through `apid`, a global permit.
/// Returns whether any was mapped.
fn forget_attachments(device: &mut Device, pid: u64, apid: AccessId) -> bool {
    // The host detaches a parked one at its source with the release.
    let unmapped = revoke_where(device, |a| a.pid == pid && a.global && a.access == apid);
    device.attachments.retain(|a| !(a.pid == pid && a.global && a.access == apid));
    unmapped
}

/// The host's name server takes back the memory behind `apid` (its owner removed the segment
/// or is gone): the permit's attachments are unmapped and their ranges stay reserved, so the
/// process's next touch is SIGBUS, as after a local remove. No CPU of the job may keep a
/// translation: the host removes the memory once this returns.
pub fn revoke_global_permit(pid: u64, apid: AccessId) {
    if !job::is_loaded() {
        return;
    }
    let unmapped = with_device(|device| {
        if device.global_permits.get(&apid.raw()).is_some_and(|permit| permit.pid == pid) {
            device.global_permits.remove(&apid.raw());
        }
        revoke_where(device, |a| a.pid == pid && a.global && a.access == apid)
    });
    if unmapped {
        crate::sched::shoot_down_user_tlbs();
    }
}

/// XEMEM's lookup: the enclave's own names first, then (connected) the whole machine's.
pub fn lookup(name: xemem::wire::Name) -> Result<i64, Error> {
    let local = with_device(|device| device.names.lookup(&name));
    match local {
        Err(Error::NotFound) if host_link::enclave_id().is_some() => match host_link::direct(Request::Lookup { name })? {
            Reply::Found(segment) => Ok(segment.raw()),
            _ => Err(Error::Malformed),
        },
        result => result.map(SegmentId::raw),
    }
}

/// Guest-physical addresses the host may hand out for its memory end here (46 bits, what
/// the page tables and every x86-64 CPU clowder runs on can address).
const HOST_MEMORY_LIMIT: u64 = 1 << 46;

/// The host's frame runs for an attach of host memory must cover exactly `size` bytes and lie
/// above the enclave's RAM (in regions the VMM added), below the physical limit.
fn host_runs_valid(runs: &[xemem::wire::FrameRun], size: u64) -> bool {
    let ram_end = crate::mm::ram_end();
    let mut pages: u64 = 0;
    for run in runs {
        if !run.valid() {
            return false;
        }
        let Some(total) = pages.checked_add(run.frames) else { return false };
        pages = total;
        if let Some(first) = run.first {
            let start = first.checked_mul(PAGE_SIZE);
            let end = start.and_then(|start| start.checked_add(run.frames.checked_mul(PAGE_SIZE)?));
            match (start, end) {
                (Some(start), Some(end)) if start >= ram_end && end <= HOST_MEMORY_LIMIT => {}
                _ => return false,
            }
        }
    }
    !runs.is_empty() && pages.checked_mul(PAGE_SIZE) == Some(size)
}

/// What an attachment is made through, where in the segment it starts, and the host's word
/// that says whether its answer still holds.
#[derive(Clone, Copy)]
struct Through {
    access: AccessId,
    segment: SegmentId,
    global: bool,
    offset: u64,
    valid_while: Option<(u64, u64)>,
}

/// Maps `runs` (`size` bytes in all) into process `pid` at `fixed`, or anywhere in the window
/// when it is 0 (`alone` in its GiBs if asked), and records the attachment; returns its address.
fn map_attachment(
    device: &mut Device,
    pid: u64,
    runs: impl Iterator<Item = SourceRun> + Clone,
    size: u64,
    fixed: u64,
    through: Through,
    alone: bool,
) -> Result<u64, Error> {
    let first_physical = runs.clone().find_map(|run| run.first).unwrap_or(0) * PAGE_SIZE;
    let start = if fixed != 0 {
        let end = fixed.checked_add(size).ok_or(Error::Invalid)?;
        // Only where nothing of the process is, or could be: not over its memory regions, not
        // over another of its attachments (XPMEM refuses a fixed attach over a mapping).
        let taken = with_job_process(pid, |process| {
            let memory = &process.memory;
            [memory.image, memory.heap, memory.mmap_window(), memory.stack].iter().any(|region| region.start < end && fixed < region.end)
        })
        .unwrap_or(true)
            || device.attachments.iter().any(|a| a.pid == pid && a.start < end && fixed < a.end)
            || snapshot::overlaps_region(pid, fixed, end);
        if taken || end > xemem::USER_ADDRESS_LIMIT {
            return Err(Error::Invalid);
        }
        fixed
    } else {
        place(&device.attachments, pid, size, first_physical, alone).ok_or(Error::Exhausted)?
    };
    let alone = alone && fixed == 0;
    let mapped = with_job_process(pid, |process| {
        let mut address = start;
        for run in runs {
            let len = run.frames * PAGE_SIZE;
            if let Some(frame) = run.first {
                // Read-only source pages stay read-only: a write through the attachment faults
                // (SIGBUS) instead of changing, say, the executable's text.
                process.memory.aspace.map(address, frame * PAGE_SIZE, len, Protection { write: run.writable, execute: false })?;
            }
            address += len;
        }
        Ok::<(), crate::arch::paging::OutOfMemory>(())
    });
    if !matches!(mapped, Some(Ok(()))) {
        let _ = with_job_process(pid, |process| process.memory.aspace.unmap(start, size));
        return Err(Error::Exhausted);
    }
    let at = device.attachments.partition_point(|a| a.start < start);
    let Through { access, segment, global, offset, valid_while } = through;
    let attachment =
        Attachment { pid, start, end: start + size, access, segment, revoked: false, global, offset, alone, parked: false, valid_while };
    device.attachments.insert(at, attachment);
    Ok(start)
}

/// Attaches through `apid`, a permit of the host's name server. A segment of a process of
/// this job maps that process's pages from its page tables, as a local attach does; any other
/// (a host process's, another enclave's) arrives as frames of regions the host added above
/// this enclave's RAM.
fn attach_global(pid: u64, apid: AccessId, permit: GlobalPermit, offset: u64, size: u64, fixed: u64) -> Result<u64, Error> {
    if !offset.is_multiple_of(PAGE_SIZE) || size == 0 {
        return Err(Error::Invalid);
    }
    let size = size.checked_next_multiple_of(PAGE_SIZE).ok_or(Error::Invalid)?;
    let reply = host_link::attach(pid, apid, permit.segment, offset, size)?;
    let detach_at_host = || {
        let _ = host_link::direct(Request::Detach { process: pid, access: apid });
    };
    let own = with_device(|device| device.own_segments.get(&permit.segment).copied());
    // The frames to map: this job's own pages from its tables, or what the host added.
    enum Frames {
        Own(Vec<SourceRun>),
        Host(Vec<xemem::wire::FrameRun>, Option<(u64, u64)>),
    }
    let frames = match (reply, own) {
        // The name server checked the permit and the range.
        (Reply::Attached { segment, .. }, Some((owner, vaddr, length)))
            if segment == permit.segment && offset.checked_add(size).is_some_and(|end| end <= length) =>
        {
            resolve(owner, vaddr + offset, size).map(Frames::Own)
        }
        (Reply::Attached { segment, runs, valid_while }, None) if segment == permit.segment && host_runs_valid(&runs, size) => {
            Some(Frames::Host(runs, valid_while.and_then(readable_word)))
        }
        _ => None,
    };
    let Some(frames) = frames else {
        detach_at_host();
        return Err(Error::Invalid);
    };
    let writable = permit.flags == xemem::ACCESS_READ_WRITE;
    let valid_while = match &frames {
        Frames::Host(_, word) => *word,
        Frames::Own(_) => None,
    };
    let through = Through { access: apid, segment: permit.segment, global: true, offset, valid_while };
    let placed = with_device(|device| {
        // The permit may have been released or revoked while the host worked.
        if held_global(device, pid, apid).is_none() {
            return Err(Error::NotFound);
        }
        match &frames {
            Frames::Own(runs) => map_attachment(device, pid, runs.iter().copied(), size, fixed, through, false),
            // Mapped as they came: a copy into a vector of its own is emulated work on PVM.
            Frames::Host(runs, word) => {
                let runs = runs.iter().map(|run| SourceRun { first: run.first, frames: run.frames, writable });
                // Alone in its GiBs, so that a detach can park it, when it may be parked.
                map_attachment(device, pid, runs, size, fixed, through, may_park(permit.segment, word.is_some()))
            }
        }
    });
    if placed.is_err() {
        detach_at_host();
    }
    placed
}

/// XPMEM lets a permit hold any number of attachments (UCX attaches a peer's FIFO, its
/// receive buffers and each user buffer through one), while the host's bridge holds one per
/// permit (its detach names only the permit): a further attachment is made through a permit
/// of its own, taken here on the same segment and released when that attachment is detached
/// or the job's permit is released.
fn attach_through_own_permit(pid: u64, apid: AccessId, permit: GlobalPermit, offset: u64, size: u64, fixed: u64) -> Result<u64, Error> {
    let request = Request::Get { process: pid, segment: permit.segment, access: permit.flags, credentials: job_credentials() };
    let Reply::Granted { access: extra, .. } = host_link::direct(request)? else { return Err(Error::Malformed) };
    let extra_permit = GlobalPermit { extra_of: Some(apid), ..permit };
    with_device(|device| device.global_permits.insert(extra.raw(), extra_permit));
    attach_global(pid, extra, extra_permit, offset, size, fixed).inspect_err(|_| {
        with_device(|device| device.global_permits.remove(&extra.raw()));
        let _ = host_link::direct(Request::Release { process: pid, access: extra });
    })
}

/// Attaches `[offset, offset + size)` of the permit's segment at `fixed` (0: anywhere in the
/// window); returns the address.
pub fn attach(raw: i64, offset: u64, size: u64, fixed: u64) -> Result<u64, Error> {
    let pid = caller();
    let apid = access_id(raw)?;
    if !fixed.is_multiple_of(PAGE_SIZE) {
        return Err(Error::Invalid);
    }
    for (process, access) in with_device(|device| drop_parked_in_the_way(device, pid, apid, size, fixed)) {
        let _ = host_link::direct(Request::Detach { process, access });
    }
    if let Some(permit) = with_device(|device| device.global_permits.get(&apid.raw()).copied()) {
        if permit.pid != pid {
            return Err(Error::Denied);
        }
        return match attach_global(pid, apid, permit, offset, size, fixed) {
            Err(Error::Exhausted) if with_device(|device| device.attachments.iter().any(|a| a.pid == pid && a.access == apid)) => {
                attach_through_own_permit(pid, apid, permit, offset, size, fixed)
            }
            attached => attached,
        };
    }
    with_device(|device| {
        let plan = device.names.attach(principal(pid), apid, offset, size)?;
        let owner = device.names.segment(plan.segment).map(|segment| segment.owner.process);
        let runs = owner.and_then(|owner| resolve(owner, plan.vaddr, plan.size));
        let mapped = match runs {
            Some(runs) => {
                let through = Through { access: apid, segment: plan.segment, global: false, offset, valid_while: None };
                map_attachment(device, pid, runs.iter().copied(), plan.size, fixed, through, false)
            }
            None => Err(Error::NotFound),
        };
        mapped.inspect_err(|_| {
            let _ = device.names.detach(principal(pid), apid);
        })
    })
}

/// What a detach found at the address.
pub enum Detached {
    /// An attachment, now unmapped whole (XPMEM detaches by any address inside it).
    Attachment,
    /// Nothing mapped there: fine, as XPMEM says.
    Nothing,
    /// The process's own memory: EINVAL.
    NotAnAttachment,
}

/// What a detach leaves to do once the device is unlocked.
enum AfterDetach {
    Nothing,
    /// Unmapped, or parked: no CPU may keep a translation.
    ShootDown,
    /// Unmapped, and the host removes its regions once told (and releases the permit when it
    /// was taken for this attachment alone).
    ShootDownAndTellHost(AccessId, bool),
}

pub fn detach(address: u64) -> Detached {
    let pid = caller();
    let (detached, after) = with_device(|device| {
        let Some(index) = device.attachments.iter().position(|a| a.pid == pid && !a.parked && a.start <= address && address < a.end) else {
            let mapped =
                with_job_process(pid, |process| process.memory.aspace.translate(address & !(PAGE_SIZE - 1)).is_ok()).unwrap_or(false);
            return (if mapped { Detached::NotAnAttachment } else { Detached::Nothing }, AfterDetach::Nothing);
        };
        let access = device.attachments[index].access;
        let own_permit = device.global_permits.get(&access.raw()).is_some_and(|permit| permit.extra_of.is_some());
        if !own_permit && park(device, index, DeviceDescriptor::Checked) {
            return (Detached::Attachment, AfterDetach::ShootDown);
        }
        if own_permit {
            device.global_permits.remove(&access.raw());
        }
        let attachment = device.attachments.remove(index);
        if attachment.revoked {
            return (Detached::Attachment, AfterDetach::Nothing);
        }
        let _ = with_job_process(pid, |process| process.memory.aspace.unmap(attachment.start, attachment.end - attachment.start));
        if attachment.global {
            return (Detached::Attachment, AfterDetach::ShootDownAndTellHost(attachment.access, own_permit));
        }
        // Bookkeeping only (the permit may be gone already: released or removed).
        let _ = device.names.detach(principal(pid), attachment.access);
        (Detached::Attachment, AfterDetach::Nothing)
    });
    match after {
        AfterDetach::Nothing => {}
        AfterDetach::ShootDown => crate::sched::shoot_down_user_tlbs(),
        // Gone from every CPU's TLB before the host may remove its regions.
        AfterDetach::ShootDownAndTellHost(access, release) => {
            crate::sched::shoot_down_user_tlbs();
            let _ = host_link::direct(Request::Detach { process: pid, access });
            if release {
                let _ = host_link::direct(Request::Release { process: pid, access });
            }
        }
    }
    detached
}
