//! XEMEM snapshots (TCASM) of the job's memory: page-table copy-on-write, the LWK side of
//! `xemem_region_alloc` / `xemem_snapshot_make` / `xemem_snapshot_release` (xpmem.h).
//!
//! A region is memory the kernel hands the job for snapshots: a physically contiguous block
//! from `pmem` (outside the job's heap, whose bookkeeping keeps one virtual-to-physical
//! offset per window), mapped read-write in a window of its own. Its first snapshot maps the
//! region's frames read-only a second time, at the region's shadow (`Region::shadow`), and
//! write-protects the writer's view; the shadow is exported as an ordinary segment (so every
//! attach path, local, another enclave's or a host process's, resolves its frames from the
//! page tables as for any segment). A store then faults (`copy_on_write`): while a snapshot is
//! out the page gets a fresh frame holding a copy, mapped writable, and the shadow keeps the
//! old frame for the readers; between snapshots the page is only made writable. Either way
//! the page joins the region's list of pages written, and the next snapshot write-protects
//! those pages again and points the shadow at their frames, nothing else: after the first,
//! a snapshot costs two page-table entries per page written since the previous one, and each
//! store to a page under a snapshot one fault and one 4 KiB copy, not the region's size
//! (on PVM every edit of a live page table and every kernel instruction is emulated, so the
//! view is never remapped whole, nor the TLB flushed whole on a one-CPU job).
//! Release removes the segment (its attachments are revoked, the host's before the remove is
//! answered) and gives the kept frames to the region's pool for later copies. A region's
//! frames (its block, and the pages its copies took from `pmem`) go back when it is freed,
//! its process ends, or the job ends. An ordinary segment made over a region between
//! snapshots makes the view writable again throughout, as the host's library folds a region
//! back to shared memory.

use super::{caller, with_device, with_job_process, Error, SourceRun};
use crate::arch::paging::{Protection, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::mm::pmem;
use crate::syscall::Errno;
use alloc::vec::Vec;

/// Regions are placed here, above XPMEM's attachments (`super::ATTACH_WINDOW_END`), one slot
/// of whole GiBs each for the view and as many again for its shadow, never reused within a job.
pub const REGION_WINDOW_START: u64 = 0x7800_0000_0000;
const REGION_WINDOW_END: u64 = 0x7f00_0000_0000;
const GIGABYTE: u64 = 1 << 30;

const EBUSY: Errno = Errno(linux_raw_sys::errno::EBUSY as u64);
const READ_WRITE: Protection = Protection { write: true, execute: false };
const READ_ONLY: Protection = Protection { write: false, execute: false };

struct Snapshot {
    /// The segment exporting the shadow; `None` while it is being made.
    segid: Option<i64>,
    /// Frames the writer no longer maps (each replaced by a copy): the readers' until release.
    kept: Vec<u64>,
}

struct Region {
    pid: u64,
    start: u64,
    size: u64,
    /// The region's own block (2 MiB aligned).
    block: u64,
    /// Pages taken from `pmem` one at a time for copies, all owned by the region.
    extra: Vec<u64>,
    /// Owned frames that nothing maps (kept frames of released snapshots), used for copies
    /// before `pmem` is asked.
    pool: Vec<u64>,
    snapshot: Option<Snapshot>,
    /// A make or release is under way (it waits for the name server without the lock).
    busy: bool,
    /// The view is write-protected but for `written`, and the shadow maps the view's frames
    /// as of the last snapshot (since the region's first snapshot).
    protected: bool,
    /// Offsets of the pages made writable since the last snapshot.
    written: Vec<u64>,
}

impl Region {
    fn shadow(&self) -> u64 {
        self.start + self.size.next_multiple_of(GIGABYTE)
    }
}

struct Regions {
    list: Vec<Region>,
    next_start: u64,
}

static REGIONS: SpinLock<Regions> = SpinLock::new(Regions { list: Vec::new(), next_start: REGION_WINDOW_START });

/// Maps each run of `runs`, laid end to end from `start`, with `protection`.
fn map_runs(pid: u64, start: u64, runs: &[SourceRun], protection: Protection) -> Result<(), Errno> {
    with_job_process(pid, |process| {
        let mut address = start;
        for run in runs {
            let len = run.frames * PAGE_SIZE;
            if let Some(frame) = run.first {
                process.memory.aspace.map(address, frame * PAGE_SIZE, len, protection).map_err(|_| Errno::ENOMEM)?;
            }
            address += len;
        }
        Ok(())
    })
    .unwrap_or(Err(Errno::ESRCH))
}

/// `XEMEM_CMD_REGION_ALLOC`: a zero-filled region of `size` bytes (rounded up to pages) for
/// process `caller`; returns its address.
pub fn region_alloc(size: u64) -> Result<u64, Errno> {
    if size == 0 || size > REGION_WINDOW_END - REGION_WINDOW_START {
        return Err(Errno::EINVAL);
    }
    let pid = caller();
    let size = size.next_multiple_of(PAGE_SIZE);
    let slot = size.next_multiple_of(GIGABYTE) * 2;
    let mut regions = REGIONS.lock();
    let start = regions.next_start;
    if start + slot > REGION_WINDOW_END {
        return Err(Errno::ENOMEM);
    }
    // Free memory is zero (pmem's invariant): nothing to clear.
    let block = pmem::allocate(size, HUGE_PAGE_SIZE).ok_or(Errno::ENOMEM)?;
    if let Err(errno) =
        map_runs(pid, start, &[SourceRun { first: Some(block / PAGE_SIZE), frames: size / PAGE_SIZE, writable: true }], READ_WRITE)
    {
        let _ = with_job_process(pid, |process| process.memory.aspace.unmap(start, size));
        pmem::free_clean(block, size);
        return Err(errno);
    }
    regions.next_start = start + slot;
    regions.list.push(Region {
        pid,
        start,
        size,
        block,
        extra: Vec::new(),
        pool: Vec::new(),
        snapshot: None,
        busy: false,
        protected: false,
        written: Vec::new(),
    });
    Ok(start)
}

/// Frees a region's frames (nothing may map them any more), clearing them with `zero`.
fn free_frames(region: Region, zero: fn(u64, u64)) {
    zero(region.block, region.size);
    pmem::free_clean(region.block, region.size);
    for page in region.extra {
        zero(page, PAGE_SIZE);
        pmem::free_clean(page, PAGE_SIZE);
    }
}

fn zero_here(physical: u64, len: u64) {
    phys::zero(physical, len as usize);
}

/// `XEMEM_CMD_REGION_FREE`: unmaps and frees the caller's region at `start`, releasing its
/// snapshot first if one is out.
pub fn region_free(start: u64) -> Result<(), Errno> {
    let pid = caller();
    let segid = {
        let regions = REGIONS.lock();
        let region = regions.list.iter().find(|r| r.pid == pid && r.start == start).ok_or(Errno::EINVAL)?;
        if region.busy {
            return Err(EBUSY);
        }
        region.snapshot.as_ref().and_then(|snapshot| snapshot.segid)
    };
    if let Some(segid) = segid {
        snapshot_release(segid)?;
    }
    let region = {
        let mut regions = REGIONS.lock();
        let index = regions.list.iter().position(|r| r.pid == pid && r.start == start && !r.busy).ok_or(Errno::EINVAL)?;
        regions.list.swap_remove(index)
    };
    let _ = with_job_process(pid, |process| process.memory.aspace.unmap(region.start, region.size));
    crate::sched::shoot_down_user_tlbs();
    free_frames(region, zero_here);
    Ok(())
}

/// `XEMEM_CMD_SNAPSHOT_MAKE`: publishes the caller's region at `start` as a read-only
/// snapshot segment (`make` makes it, from the shadow's address and size); returns its segid.
pub fn snapshot_make(start: u64, make: impl FnOnce(u64, u64) -> Result<i64, Error>) -> Result<i64, Errno> {
    let pid = caller();
    let size = {
        let mut regions = REGIONS.lock();
        let region = regions.list.iter_mut().find(|r| r.pid == pid && r.start == start).ok_or(Errno::EINVAL)?;
        if region.busy || region.snapshot.is_some() {
            return Err(EBUSY);
        }
        // Busy: no segment can be made over it meanwhile (`unprotect_for_export`).
        region.busy = true;
        region.size
    };
    // Attachers of a segment over the view would see the writer's copies no more. (The device
    // is looked at without the regions' lock: attaches take them in that order.)
    let end = start + size;
    let exported = with_device(|device| {
        let mine = super::principal(pid);
        device.own_segments.values().any(|&(owner, vaddr, length)| owner == pid && vaddr < end && start < vaddr + length)
            || device
                .names
                .owned_by(mine)
                .iter()
                .filter_map(|id| device.names.segment(*id))
                .any(|s| s.vaddr < end && start < s.vaddr + s.size)
    });
    let shadow = {
        let mut regions = REGIONS.lock();
        // Gone only with its process, which is ending.
        let Some(region) = regions.list.iter_mut().find(|r| r.pid == pid && r.start == start) else { return Err(Errno::ESRCH) };
        let protected = match exported {
            true => Err(EBUSY),
            false if region.protected => protect_written(region),
            false => protect_whole(region),
        };
        if let Err(errno) = protected {
            region.busy = false;
            return Err(errno);
        }
        region.snapshot = Some(Snapshot { segid: None, kept: Vec::new() });
        region.shadow()
    };
    // No other CPU may keep a writable translation of the view: its stores would reach the
    // snapshot (this CPU's went with each change).
    shoot_down_elsewhere();
    let made = make(shadow, size);
    let mut regions = REGIONS.lock();
    let Some(region) = regions.list.iter_mut().find(|r| r.pid == pid && r.start == start) else { return Err(Errno::ESRCH) };
    region.busy = false;
    match made {
        Ok(segid) => {
            if let Some(snapshot) = region.snapshot.as_mut() {
                snapshot.segid = Some(segid);
            }
            Ok(segid)
        }
        Err(error) => {
            // Nothing was exported: the view stays protected, its copies count as written.
            let kept = region.snapshot.take().map(|snapshot| snapshot.kept).unwrap_or_default();
            region.pool.extend(kept);
            Err(Errno(error.errno() as u64))
        }
    }
}

/// The region's first snapshot: the shadow maps the view's frames and the view becomes
/// read-only, run by run (2 MiB leaves where the block is whole).
fn protect_whole(region: &mut Region) -> Result<(), Errno> {
    let (pid, start, size) = (region.pid, region.start, region.size);
    let runs = with_job_process(pid, |process| super::resolve_from_tables(process, start, size)).ok_or(Errno::ESRCH)?;
    // The job unmapped part of it: there is no whole version to publish.
    if runs.iter().any(|run| run.first.is_none()) {
        return Err(Errno::EFAULT);
    }
    map_runs(pid, region.shadow(), &runs, READ_ONLY)?;
    map_runs(pid, start, &runs, READ_ONLY)?;
    region.protected = true;
    region.written.clear();
    Ok(())
}

/// A later snapshot: only the pages written since the last one change, in the view (read-only
/// again) and in the shadow (their current frames).
fn protect_written(region: &mut Region) -> Result<(), Errno> {
    let (pid, start, shadow) = (region.pid, region.start, region.shadow());
    let written = core::mem::take(&mut region.written);
    let done = with_job_process(pid, |process| {
        let aspace = &mut process.memory.aspace;
        for (done, &offset) in written.iter().enumerate() {
            // A page the job unmapped since keeps its old frame in the shadow.
            let Ok(view) = aspace.translate(start + offset) else { continue };
            let protected = aspace.map(start + offset, view.physical, PAGE_SIZE, READ_ONLY).is_ok()
                && (aspace.translate(shadow + offset).map(|t| t.physical).ok() == Some(view.physical)
                    || aspace.map(shadow + offset, view.physical, PAGE_SIZE, READ_ONLY).is_ok());
            if !protected {
                return done;
            }
        }
        written.len()
    })
    .unwrap_or(0);
    if done < written.len() {
        // Out of page-table memory: the pages not done are still written (and may be writable).
        region.written = written[done..].to_vec();
        return Err(Errno::ENOMEM);
    }
    Ok(())
}

/// Other CPUs of the job drop their user translations; a one-CPU job has none to drop (a full
/// flush here would cost a refill of every page touched next, each a host fault on PVM).
fn shoot_down_elsewhere() {
    if crate::sched::online_cpu_mask().count_ones() > 1 {
        crate::sched::shoot_down_user_tlbs();
    }
}

/// Makes `[start, start + size)`'s part of process `pid`'s regions writable throughout, for an
/// ordinary segment over it (its attachers map the view's frames, and the writer's stores
/// must reach them); the next snapshot protects it whole again. EBUSY while a snapshot of
/// such a region is out.
pub fn unprotect_for_export(pid: u64, start: u64, size: u64) -> Result<(), Error> {
    let end = start.saturating_add(size);
    let overlapping = |r: &Region| r.pid == pid && r.start < end && start < r.start + r.size;
    let mut regions = REGIONS.lock();
    if regions.list.iter().any(|r| overlapping(r) && (r.snapshot.is_some() || r.busy)) {
        return Err(Error::Exhausted);
    }
    for region in regions.list.iter_mut().filter(|r| overlapping(r) && r.protected) {
        let (start, size) = (region.start, region.size);
        let runs = with_job_process(pid, |process| super::resolve_from_tables(process, start, size)).unwrap_or_default();
        let mut address = start;
        for run in runs {
            if run.first.is_some() && !run.writable {
                let _ = map_runs(pid, address, &[run], READ_WRITE);
            }
            address += run.frames * PAGE_SIZE;
        }
        region.protected = false;
        region.written.clear();
    }
    Ok(())
}

/// `XEMEM_CMD_SNAPSHOT_RELEASE`: withdraws the caller's snapshot `segid` (ENOENT when it is
/// not one that is out).
pub fn snapshot_release(segid: i64) -> Result<(), Errno> {
    let pid = caller();
    let is_ours = |r: &Region| r.pid == pid && r.snapshot.as_ref().is_some_and(|s| s.segid == Some(segid));
    {
        let mut regions = REGIONS.lock();
        let region = regions.list.iter_mut().find(|r| is_ours(r)).ok_or(Errno::ENOENT)?;
        if region.busy {
            return Err(EBUSY);
        }
        region.busy = true;
    }
    // Attachments are revoked (the host's before it answers) before the kept frames are reused.
    let removed = super::remove(segid);
    let mut regions = REGIONS.lock();
    let Some(region) = regions.list.iter_mut().find(|r| is_ours(r)) else { return Err(Errno::ESRCH) };
    region.busy = false;
    match removed {
        // NotFound: the segment went already (its owner's process was told so by the host).
        Ok(()) | Err(Error::NotFound) => {
            // The shadow still maps the kept frames until the next snapshot points it at the
            // pages written: nothing exports it meanwhile, and copies only happen under one.
            let kept = region.snapshot.take().map(|snapshot| snapshot.kept).unwrap_or_default();
            region.pool.extend(kept);
            Ok(())
        }
        Err(error) => Err(Errno(error.errno() as u64)),
    }
}

/// A user write fault at `address`: when it hits a write-protected page of a region of the
/// faulting process, the page is made writable (true: the store is retried), with a copy of
/// its own while a snapshot is out. A page already writable (a stale translation on this
/// CPU) is retried too. Anything else is not a region's fault (false).
pub fn copy_on_write(address: u64) -> bool {
    let pid = caller();
    let page = address & !(PAGE_SIZE - 1);
    let mut regions = REGIONS.lock();
    let Some(region) = regions.list.iter_mut().find(|r| r.pid == pid && r.protected && r.start <= address && address < r.start + r.size)
    else {
        return false;
    };
    let translation = with_job_process(pid, |process| process.memory.aspace.translate(page));
    let old = match translation {
        Some(Ok(translation)) if translation.writable => {
            crate::arch::paging::flush_user_tlb();
            return true;
        }
        Some(Ok(translation)) => translation.physical,
        _ => return false,
    };
    let frame = if region.snapshot.is_some() {
        let fresh = match region.pool.pop() {
            Some(frame) => frame,
            None => match pmem::allocate_pages(1) {
                Some(frame) => {
                    region.extra.push(frame);
                    frame
                }
                None => return false,
            },
        };
        phys::bytes_mut(fresh, PAGE_SIZE as usize).copy_from_slice(phys::bytes(old, PAGE_SIZE as usize));
        fresh
    } else {
        old
    };
    // In place where a 4 KiB leaf maps the page already (the first store to a 2 MiB page of
    // the view splits it).
    let mapped = with_job_process(pid, |process| {
        let aspace = &mut process.memory.aspace;
        aspace.make_page_writable(page, frame) || aspace.map(page, frame, PAGE_SIZE, READ_WRITE).is_ok()
    });
    if mapped != Some(true) {
        if frame != old {
            region.pool.push(frame);
        }
        return false;
    }
    region.written.push(page - region.start);
    if let Some(snapshot) = region.snapshot.as_mut().filter(|_| frame != old) {
        snapshot.kept.push(old);
    }
    true
}

/// Whether `[start, end)` overlaps a region of process `pid`, its view or its shadow (a
/// fixed-address attach must not replace either).
pub fn overlaps_region(pid: u64, start: u64, end: u64) -> bool {
    REGIONS.lock().list.iter().any(|r| r.pid == pid && r.start < end && start < r.shadow() + r.size)
}

/// Process `pid` is ending (its segments, snapshots among them, are removed): its regions go,
/// unmapped from its address space first.
pub fn process_ended(pid: u64) {
    let gone: Vec<Region> = {
        let mut regions = REGIONS.lock();
        let (gone, kept) = core::mem::take(&mut regions.list).into_iter().partition(|r| r.pid == pid);
        regions.list = kept;
        gone
    };
    if gone.is_empty() {
        return;
    }
    let _ = with_job_process(pid, |process| {
        for region in &gone {
            let _ = process.memory.aspace.unmap(region.start, region.shadow() + region.size - region.start);
        }
    });
    crate::sched::shoot_down_user_tlbs();
    for region in gone {
        free_frames(region, zero_here);
    }
}

/// The job ended (no CPU uses its address spaces): every region's frames go back, cleared with
/// `zero` (the host clears large ranges).
pub fn forget_job(zero: fn(u64, u64)) {
    let mut regions = REGIONS.lock();
    regions.next_start = REGION_WINDOW_START;
    for region in core::mem::take(&mut regions.list) {
        free_frames(region, zero);
    }
}
