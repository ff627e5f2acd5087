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

/// The path the job opens; `libxpmem` switches to its ioctl backend when it opens.
pub const DEVICE_PATH: &str = "/dev/xpmem";

/// Attachments live here: above any heap the loader can place (the heap starts just above the
/// image, below 0x5600_0000_0000 for any RAM size an enclave gets) and below the stack
/// (which ends at 0x7fff_ffe0_0000 and is at most a few GiB).
const ATTACH_WINDOW_START: u64 = 0x7000_0000_0000;
const ATTACH_WINDOW_END: u64 = 0x7f00_0000_0000;
const GIGABYTE: u64 = 1 << 30;

/// This enclave as its own name server knows it, standalone (enclave 1, as in XEMEM);
/// connected, its segments carry the id the host's name server handed out.
const LOCAL_ENCLAVE: xemem::ids::EnclaveId = xemem::ids::NAME_SERVER_ENCLAVE;

/// The job runs as root inside its enclave (see `syscall/getuid.rs`): segments are owned by
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
    host_link::process_ended(pid, segments, permits)
}

/// Does a user fault at `address` hit an attachment of the faulting process? Then it gets
/// SIGBUS, not SIGSEGV.
pub fn is_attachment_fault(address: u64) -> bool {
    // Only user-mode faults come here, and a CPU returns to user mode with no lock held, so
    // this CPU cannot hold the lock. Another CPU may (a revoke unmapping this very range): wait
    // for it, or the fault would be taken for a SIGSEGV.
    let pid = caller();
    DEVICE.lock().as_ref().is_some_and(|device| device.attachments.iter().any(|a| a.pid == pid && !a.parked && a.start <= address && address < a.end))
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
    let pid = caller();
    let owner = Owner { uid: JOB_UID, gid: JOB_GID, mode: 0o666 };
    if connected() {
        return make_global(pid, vaddr, size, owner, Some(name));
    }
    with_device(|device| device.names.make(principal(pid), vaddr, size, owner, Some(name))).map(SegmentId::raw)
}

pub fn make(vaddr: u64, size: u64, permit_type: u32, mode: u64) -> Result<i64, Error> {
    if permit_type != commands::PERMIT_MODE || mode > xemem::perm::MAX_MODE as u64 {
        return Err(Error::Invalid);
    }
    let pid = caller();
    let owner = Owner { uid: JOB_UID, gid: JOB_GID, mode: mode as u32 };
    if connected() {
        return make_global(pid, vaddr, size, owner, None);
    }
    with_device(|device| device.names.make(principal(pid), vaddr, size, owner, None)).map(SegmentId::raw)
}

/// Unmaps the attachments `which` selects (in whichever process holds them) and keeps their
/// ranges reserved (that process's next touch is SIGBUS, until it detaches them). Returns
/// whether any was mapped.
fn revoke_where(device: &mut Device, which: impl Fn(&Attachment) -> bool) -> bool {
    // Parked ones were detached by the job already: they go for good.
    drop_parked_where(device, &which);
    let mut unmapped = false;
    for attachment in device.attachments.iter_mut().filter(|a| !a.revoked && which(a)) {
        attachment.revoked = true;
        let _ = with_job_process(attachment.pid, |process| process.memory.aspace.unmap(attachment.start, attachment.end - attachment.start));
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
            with_device(|device| device.global_permits.insert(access.raw(), GlobalPermit { pid, flags, segment: id }));
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
        Ok(forget_attachments(device, pid, apid))
    });
    match global {
        Err(local) => local,
        Ok(unmapped) => {
            if unmapped {
                crate::sched::shoot_down_user_tlbs();
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
            [memory.image, memory.heap, memory.stack].iter().any(|region| region.start < end && fixed < region.end)
        })
        .unwrap_or(true)
            || device.attachments.iter().any(|a| a.pid == pid && a.start < end && fixed < a.end);
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
    let attachment = Attachment { pid, start, end: start + size, access, segment, revoked: false, global, offset, alone, parked: false, valid_while };
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
        (Reply::Attached { segment, .. }, Some((owner, vaddr, length))) if segment == permit.segment && offset.checked_add(size).is_some_and(|end| end <= length) => {
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
        return attach_global(pid, apid, permit, offset, size, fixed);
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

/// Parked attachments: a detach of an attachment of host-added memory (a host process's or
/// another enclave's segment) suspends its tables and keeps it, unknown to the host, and an
/// attach of the same range through the same permit resumes it: one table write per GiB, no
/// request to the host. A round trip to the host is thousands of kernel instructions,
/// milliseconds where they are emulated (PVM), and in-situ analytics attach their simulation's
/// data again at every step. To the job a parked attachment is gone (touching it is SIGSEGV,
/// detaching it again does nothing); to the host it is still attached, so whatever ends an
/// attachment ends it too: the owner's remove or end revokes the permit, a release (the
/// process's or the job's end releases its permits) detaches it at the host. Only an attach
/// of the same range gets it back; an attach of another range through the permit, or one at
/// a fixed address in its GiBs, first drops it and detaches it at the host (the host keeps
/// one attachment per permit). What it maps is what the host answered for it, taken up again
/// only while that still holds as far as [`may_park`] can tell: for another enclave's segment,
/// while the owner kernel's count of page-table changes has not moved; for a host process's,
/// as an attachment the job never detached would keep it.
fn park(device: &mut Device, index: usize, descriptor: DeviceDescriptor) -> bool {
    let attachment = &device.attachments[index];
    let (pid, start, end) = (attachment.pid, attachment.start, attachment.end);
    let (from, to) = attachment.reserved();
    let parkable = attachment.alone
        && !attachment.revoked
        && device.attachments.iter().enumerate().all(|(other, a)| other == index || a.pid != pid || a.end <= from || to <= a.start);
    let parked = parkable && descriptor.change_tables(pid, |aspace| aspace.suspend(start, end)).unwrap_or(false);
    device.attachments[index].parked = parked;
    parked
}

/// The descriptor a command came through: `/dev/xpmem` as the general ioctl path found, or one
/// to be checked while the caller's process is at hand (the paths that answer before it).
#[derive(Clone, Copy)]
enum DeviceDescriptor {
    Checked,
    Unchecked(Fd),
}

impl DeviceDescriptor {
    /// Runs `change` on the address space of process `pid` when the command came through
    /// `/dev/xpmem`; whether it did (`None`: no such process). One lookup of the process.
    fn change_tables(self, pid: u64, change: impl FnOnce(&mut crate::mm::aspace::AddressSpace)) -> Option<bool> {
        with_job_process(pid, |process| {
            let through_device = match self {
                DeviceDescriptor::Checked => true,
                DeviceDescriptor::Unchecked(fd) => process.descriptors.get(fd).is_some_and(|open| matches!(*open, job::descriptors::Descriptor::Xpmem)),
            };
            if through_device {
                change(&mut process.memory.aspace);
            }
            through_device
        })
    }
}

/// The detach by the calling process, through descriptor `fd` of `/dev/xpmem`, of an
/// attachment at `address` that can be parked (see [`park`]): parked under one device lock
/// and one process lookup, which also checks the descriptor. False: nothing parked; the
/// general path answers (ENOTTY for another descriptor, the unmap of an attachment that
/// cannot be parked).
pub fn park_detached(fd: Fd, address: u64) -> bool {
    let pid = caller();
    let parked = with_device(|device| {
        let index = device.attachments.iter().position(|a| a.pid == pid && !a.parked && a.start <= address && address < a.end);
        index.is_some_and(|index| park(device, index, DeviceDescriptor::Unchecked(fd)))
    });
    if parked {
        crate::sched::shoot_down_user_tlbs();
    }
    parked
}

/// Unlinks the parked attachments `which` selects for good (their tables retired) and forgets
/// them; returns their permits.
fn drop_parked_where(device: &mut Device, which: impl Fn(&Attachment) -> bool) -> Vec<(u64, AccessId)> {
    let mut dropped = Vec::new();
    for attachment in device.attachments.iter().filter(|a| a.parked && which(a)) {
        let _ = with_job_process(attachment.pid, |process| process.memory.aspace.drop_suspended(attachment.start, attachment.end));
        dropped.push((attachment.pid, attachment.access));
    }
    if !dropped.is_empty() {
        device.attachments.retain(|a| !(a.parked && which(a)));
    }
    dropped
}

/// The attach of the same range through the same permit, by the calling process, at `fixed`
/// (0: anywhere) or where it was, through descriptor `fd` of `/dev/xpmem`, when it is parked
/// and its answer still holds: takes it up again and returns its address, on as few kernel
/// instructions as it can (the device and the process are each looked up once, the descriptor
/// checked on the way). `None` for anything else: the general path ([`attach`]) answers it.
pub fn resume_same(fd: Fd, raw: i64, offset: u64, size: u64, fixed: u64) -> Option<u64> {
    let pid = caller();
    let rounded = size.checked_next_multiple_of(PAGE_SIZE)?;
    let mut device = DEVICE.lock();
    let attachment = device.as_mut()?.attachments.iter_mut().find(|a| a.parked && a.pid == pid && a.access.raw() == raw)?;
    let same = attachment.offset == offset && attachment.end - attachment.start == rounded && (fixed == 0 || fixed == attachment.start);
    if !same || !offset.is_multiple_of(PAGE_SIZE) || !still_holds(attachment) {
        return None;
    }
    let (start, end) = (attachment.start, attachment.end);
    let resumed = DeviceDescriptor::Unchecked(fd).change_tables(pid, |aspace| aspace.resume(start, end))?;
    attachment.parked = !resumed;
    resumed.then_some(start)
}

/// An attach by `pid` through `apid` of `[offset, offset + size)` at `fixed` (0: anywhere)
/// that [`resume_same`] did not answer: any parked attachment in its way (of the permit, whose
/// range or answer differs, or in the GiBs a fixed address falls in) is dropped; returns their
/// permits, to be detached at the host.
fn drop_parked_in_the_way(device: &mut Device, pid: u64, apid: AccessId, size: u64, fixed: u64) -> Vec<(u64, AccessId)> {
    let fixed_end = fixed.saturating_add(size.checked_next_multiple_of(PAGE_SIZE).unwrap_or(0));
    drop_parked_where(device, |a| {
        let (from, to) = a.reserved();
        a.pid == pid && (a.access == apid || (fixed != 0 && from < fixed_end && fixed < to))
    })
}

/// Whether an attachment of `segment` may be parked. A host process's segment (the name
/// server's daemon's broker serves it): the owner's library answers an attach with the memory
/// it maps there, and a parked attachment keeps that memory, as one the job never detached
/// would; memory the owner's application put under the range since is seen by a new attach
/// only (the library's caveats, docs/xemem.md). Another enclave's segment when the host's
/// answer came with its word (`with_word`): the owner kernel's count of page-table changes,
/// which the host mapped read-only into this machine. A parked attachment whose word moved is
/// not taken up again: the attach asks the host, and sees what the owner mapped since.
fn may_park(segment: SegmentId, with_word: bool) -> bool {
    segment.enclave() == xemem::ids::NAME_SERVER_ENCLAVE || with_word
}

/// The host's word (see [`may_park`]) as (guest-physical address, value), made readable
/// through the kernel's physical-memory window; `None` if it does not lie in a region the host
/// added (above RAM), 8-aligned.
fn readable_word(word: xemem::wire::MappingWord) -> Option<(u64, u64)> {
    let lies_in_host_memory = word.address >= crate::mm::ram_end() && word.address < HOST_MEMORY_LIMIT && word.address.is_multiple_of(8);
    if !lies_in_host_memory {
        return None;
    }
    crate::mm::map_device_page(word.address & !(PAGE_SIZE - 1));
    Some((word.address, word.value))
}

/// Whether a parked attachment's answer still holds: the host's word has not moved.
fn still_holds(attachment: &Attachment) -> bool {
    attachment.valid_while.is_none_or(|(address, value)| crate::arch::phys::read_volatile::<u64>(address) == value)
}

/// What a detach leaves to do once the device is unlocked.
enum AfterDetach {
    Nothing,
    /// Unmapped, or parked: no CPU may keep a translation.
    ShootDown,
    /// Unmapped, and the host removes its regions once told.
    ShootDownAndTellHost(AccessId),
}

pub fn detach(address: u64) -> Detached {
    let pid = caller();
    let (detached, after) = with_device(|device| {
        let Some(index) = device.attachments.iter().position(|a| a.pid == pid && !a.parked && a.start <= address && address < a.end) else {
            let mapped = with_job_process(pid, |process| process.memory.aspace.translate(address & !(PAGE_SIZE - 1)).is_ok()).unwrap_or(false);
            return (if mapped { Detached::NotAnAttachment } else { Detached::Nothing }, AfterDetach::Nothing);
        };
        if park(device, index, DeviceDescriptor::Checked) {
            return (Detached::Attachment, AfterDetach::ShootDown);
        }
        let attachment = device.attachments.remove(index);
        if attachment.revoked {
            return (Detached::Attachment, AfterDetach::Nothing);
        }
        let _ = with_job_process(pid, |process| process.memory.aspace.unmap(attachment.start, attachment.end - attachment.start));
        if attachment.global {
            return (Detached::Attachment, AfterDetach::ShootDownAndTellHost(attachment.access));
        }
        // Bookkeeping only (the permit may be gone already: released or removed).
        let _ = device.names.detach(principal(pid), attachment.access);
        (Detached::Attachment, AfterDetach::Nothing)
    });
    match after {
        AfterDetach::Nothing => {}
        AfterDetach::ShootDown => crate::sched::shoot_down_user_tlbs(),
        // Gone from every CPU's TLB before the host may remove its regions.
        AfterDetach::ShootDownAndTellHost(access) => {
            crate::sched::shoot_down_user_tlbs();
            let _ = host_link::direct(Request::Detach { process: pid, access });
        }
    }
    detached
}

/// XEMEM's signals: the owner's side. Each segment that was signalled or asked for a
/// notification descriptor has one counter (eventfd semantics: a read takes the count and
/// leaves 0; it waits, or fails with EAGAIN, while the count is 0); every descriptor of the
/// segment shares it.
pub struct Notifier {
    pending: AtomicU64,
    /// Signals received so far (an edge-triggered epoll reports the descriptor again after each).
    signals: AtomicU64,
    /// The process that owns the segment (its notifier goes when it ends).
    owner: u64,
}

impl Notifier {
    /// The kernel key its readers wait on: its own address.
    fn key(&self) -> u64 {
        self as *const Notifier as u64
    }

    /// Whether a read would take a count now (`poll`).
    pub fn is_readable(&self) -> bool {
        self.pending.load(Ordering::Acquire) != 0
    }

    /// Signals received so far (epoll's edge-triggered mode).
    pub fn signals(&self) -> u64 {
        self.signals.load(Ordering::Acquire)
    }
}

/// Notifiers by segment (of any process of the job).
static NOTIFIERS: SpinLock<BTreeMap<SegmentId, Arc<Notifier>>> = SpinLock::new(BTreeMap::new());

fn notifier(owner: u64, segment: SegmentId) -> Arc<Notifier> {
    NOTIFIERS.lock().entry(segment).or_insert_with(|| Arc::new(Notifier { pending: AtomicU64::new(0), signals: AtomicU64::new(0), owner })).clone()
}

/// An attacher signalled `segment`, owned by process `owner` of the job (checked by the name
/// server: the local one, or the host's, whose `Notify` reaches the node). Wakes the readers.
pub fn notify(owner: u64, segment: SegmentId) {
    if !job::is_loaded() || !job::process_exists(owner) {
        return;
    }
    let notifier = notifier(owner, segment);
    notifier.pending.fetch_add(1, Ordering::AcqRel);
    notifier.signals.fetch_add(1, Ordering::AcqRel);
    crate::sched::wake_kernel_key(notifier.key());
}

/// `xemem_signal(apid)`: the caller's permit `apid` wakes the segment's owner.
pub fn signal(raw: i64) -> Result<(), Error> {
    let pid = caller();
    let apid = access_id(raw)?;
    let global = with_device(|device| device.global_permits.get(&apid.raw()).copied());
    match global {
        Some(permit) if permit.pid != pid => Err(Error::Denied),
        Some(_) => host_link::direct(Request::Signal { process: pid, access: apid }).map(drop),
        None => {
            let (owner, segment) = with_device(|device| device.names.signal(principal(pid), apid))?;
            notify(owner.process, segment);
            Ok(())
        }
    }
}

/// `xemem_notify_fd(segid)`: the notifier of the caller's own segment `raw` (ENOENT for any
/// other, as the host's library, which knows only its own).
pub fn notifier_of(raw: i64) -> Result<Arc<Notifier>, Error> {
    let pid = caller();
    let id = segment_id(raw)?;
    let owned = with_device(|device| match device.own_segments.get(&id) {
        Some(&(owner, _, _)) => owner == pid,
        None => device.names.segment(id).is_some_and(|segment| segment.owner == principal(pid)),
    });
    if !owned {
        return Err(Error::NotFound);
    }
    Ok(notifier(pid, id))
}

/// How long a reader of a notification descriptor sleeps at a time in a persistent enclave:
/// the host's `Notify` may wake it, so its wait must not count as part of a dead-lock (the
/// scheduler ends a job whose threads all wait with no deadline).
const CONNECTED_WAIT_NS: u64 = 100_000_000;

/// `read` of a notification descriptor: 8 bytes, the count since the last read.
pub fn read_notifier(notifier: &Notifier, buffer: UserAddr, len: u64, non_blocking: bool) -> SyscallResult {
    if len < 8 {
        return Err(Errno::EINVAL);
    }
    let mut interrupted = false;
    loop {
        let count = notifier.pending.swap(0, Ordering::AcqRel);
        if count != 0 {
            if let Err(errno) = user::write_bytes(buffer, &count.to_le_bytes()) {
                notifier.pending.fetch_add(count, Ordering::AcqRel);
                return Err(errno);
            }
            return Ok(8);
        }
        if non_blocking {
            return Err(Errno::EAGAIN);
        }
        // A signal ends the wait as on Linux (EINTR, or restarted under SA_RESTART), once a
        // last look has found nothing.
        if interrupted {
            return Err(Restart::Always.errno());
        }
        let deadline = crate::enclave::is_active().then(|| crate::clock::monotonic_ns() + CONNECTED_WAIT_NS);
        let nothing = || notifier.pending.load(Ordering::Acquire) == 0;
        interrupted = matches!(crate::sched::wait(notifier.key(), u32::MAX, deadline, nothing), Some(WaitResult::Interrupted | WaitResult::Signal));
    }
}
