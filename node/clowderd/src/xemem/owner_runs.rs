//! What owner enclaves answered to this daemon's attaches, kept while the owner's mappings
//! stand still, and host processes' attaches of enclave memory named as ranges of its RAM.

use super::*;

/// Frames owner enclaves resolved for the daemon's attaches (its host processes' and its
/// bridges'), kept while the owner kernel's count of page-table changes has not moved
/// ([`FrameSource::mapping_changes`]): attaching the same range again then takes no round
/// trip through the owner's kernel, whose code this machine emulates (milliseconds). The
/// name server still checks and counts every attach; the runs are checked against the
/// owner's RAM again as any answer is.
#[derive(Default)]
pub(super) struct OwnerRuns {
    pub(super) entries: VecDeque<OwnerRunsEntry>,
}

pub(super) struct OwnerRunsEntry {
    /// The owner's RAM when it answered: an enclave id may later name another enclave.
    pub(super) ram: std::sync::Weak<dyn FrameSource>,
    pub(super) owner: Principal,
    pub(super) vaddr: u64,
    pub(super) size: u64,
    pub(super) changes: u64,
    pub(super) runs: Vec<FrameRun>,
}

/// How many owner answers are kept (the oldest goes first).
pub(super) const OWNER_RUNS_KEPT: usize = 64;

/// An attach the name server would plan now, with the owner's RAM and its count of changes.
pub(super) struct OwnerProbe {
    pub(super) plan: xemem::nameserver::AttachPlan,
    pub(super) ram: Arc<dyn FrameSource>,
    pub(super) changes: u64,
}

impl OwnerRuns {
    pub(super) fn recall(&self, probe: &OwnerProbe) -> Option<Vec<FrameRun>> {
        self.entries.iter().find(|e| e.answers(probe) && e.changes == probe.changes).map(|e| e.runs.clone())
    }

    pub(super) fn keep(&mut self, probe: OwnerProbe, runs: Vec<FrameRun>) {
        self.entries.retain(|e| !e.answers(&probe) && e.ram.strong_count() > 0);
        if self.entries.len() >= OWNER_RUNS_KEPT {
            self.entries.pop_front();
        }
        let plan = probe.plan;
        self.entries.push_back(OwnerRunsEntry {
            ram: Arc::downgrade(&probe.ram),
            owner: plan.owner,
            vaddr: plan.vaddr,
            size: plan.size,
            changes: probe.changes,
            runs,
        });
    }
}

impl OwnerRunsEntry {
    /// Whether this is the same owner's answer for the same range (whatever its count).
    pub(super) fn answers(&self, probe: &OwnerProbe) -> bool {
        std::ptr::addr_eq(self.ram.as_ptr(), Arc::as_ptr(&probe.ram))
            && self.owner == probe.plan.owner
            && self.vaddr == probe.plan.vaddr
            && self.size == probe.plan.size
    }
}

impl XememLinks {
    /// Attaches through `access`, a permit the daemon's node granted to `process`: the owner
    /// enclave's frame runs, each checked against its RAM and named as a range of its RAM
    /// memfd, and where the owner kernel's count of page-table changes lies with the value
    /// the runs hold while (when the owner publishes one and it stood still while they were
    /// had). `for_vmm`: for another enclave, whose VMM maps the runs ([`file_runs`]). Any
    /// failure detaches again.
    pub(super) fn attach_enclave_memory(
        &self,
        process: u64,
        access: AccessId,
        offset: u64,
        size: u64,
        for_vmm: bool,
    ) -> Result<(SegmentId, Vec<xemem_host::EnclaveRun>, Option<OwnerCount>), Error> {
        let (segment, runs, count) = self.owner_runs(process, access, offset, size)?;
        let checked = self.owner_ram(segment).ok_or(Error::Unreachable).and_then(|ram| file_runs(&*ram, &runs, for_vmm));
        let runs = match checked {
            Ok(runs) => runs,
            Err(error) => {
                let _ = self.call(Request::Detach { process, access });
                return Err(error);
            }
        };
        let runs = runs
            .into_iter()
            .map(|run| match run {
                FileRun::Memory { file, offset, len } => xemem_host::EnclaveRun::Memory { file: file.into(), offset, length: len },
                FileRun::Hole { len } => xemem_host::EnclaveRun::Hole { length: len },
            })
            .collect();
        Ok((segment, runs, count))
    }

    /// The owner's frames for an attach through this daemon's permit `access`: kept from an
    /// earlier attach of the same range while the owner kernel changed no mapping since (the
    /// name server counts the attach as if the owner had answered), else asked of the owner,
    /// whose answer is kept when no mapping changed while it was asked. With them, when the
    /// owner publishes its count of changes and it stood still: the owner's RAM and the count
    /// the runs hold while.
    pub(super) fn owner_runs(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Result<OwnerAnswer, Error> {
        let probe = {
            let mut links = self.links.lock().unwrap();
            let probe = links.probe_owner(process, access, offset, size);
            if let Some(probe) = probe.as_ref() {
                if let Some((segment, runs)) = links.attach_from_kept(probe, process, access, offset, size) {
                    return Ok((segment, runs, Some(OwnerCount { ram: probe.ram.clone(), value: probe.changes })));
                }
            }
            probe
        };
        let (segment, runs) = match self.call(Request::Attach { process, access, offset, size })? {
            Reply::Attached { segment, runs, .. } => (segment, runs),
            _ => return Err(Error::Malformed),
        };
        let mut count = None;
        if let Some(probe) = probe {
            if probe.plan.segment == segment && probe.ram.mapping_changes() == Some(probe.changes) {
                count = Some(OwnerCount { ram: probe.ram.clone(), value: probe.changes });
                self.links.lock().unwrap().owner_runs.keep(probe, runs.clone());
            }
        }
        Ok((segment, runs, count))
    }
}

impl Links {
    /// The owner's runs kept for `probe`'s range, the attach counted by the name server.
    pub(super) fn attach_from_kept(
        &mut self,
        probe: &OwnerProbe,
        process: u64,
        access: AccessId,
        offset: u64,
        size: u64,
    ) -> Option<(SegmentId, Vec<FrameRun>)> {
        let runs = self.owner_runs.recall(probe)?;
        let me = self.node.id()?;
        self.node.name_server_mut()?.attach(Principal { enclave: me, process }, access, offset, size).ok()?;
        Some((probe.plan.segment, runs))
    }

    /// What attaching `[offset, offset + size)` through this daemon's `access` would ask of
    /// the owner, when the owner is a linked enclave that publishes its count of changes.
    pub(super) fn probe_owner(&self, process: u64, access: AccessId, offset: u64, size: u64) -> Option<OwnerProbe> {
        let me = self.node.id()?;
        let plan = self.node.name_server()?.plan_attach(Principal { enclave: me, process }, access, offset, size).ok()?;
        let link = self.node.route(plan.owner.enclave)?;
        let ram = self.ram.get(&link)?.clone();
        let changes = ram.mapping_changes()?;
        Some(OwnerProbe { plan, ram, changes })
    }
}

/// Checks every frame run against the enclave's RAM and names it as a range of the RAM memfd.
/// An enclave whose RAM is on 2 MiB hugetlb pages can share only whole pages with a host
/// process (`for_vmm` false): a process can map a hugetlb file only in 2 MiB pieces, and
/// rounding a run out would hand it the enclave's neighbouring memory; such an attach is
/// refused with EINVAL (`WholePagesOnly`, which a host caller's library can name:
/// `xemem_errmsg`), and said once here. Runs for another enclave (`for_vmm`) may be any pages:
/// its VMM maps the whole hugepages but gives the guest a memory slot of the run alone.
pub fn file_runs(ram: &dyn FrameSource, runs: &[FrameRun], for_vmm: bool) -> Result<Vec<FileRun>, Error> {
    let page = xemem::PAGE_SIZE;
    let unit = ram.mappable_unit();
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let len = run.frames.checked_mul(page).ok_or(Error::Invalid)?;
        match run.first {
            None => out.push(FileRun::Hole { len }),
            Some(first) => {
                let gpa = first.checked_mul(page).ok_or(Error::Invalid)?;
                let (file, offset) = ram.file_range(gpa, len)?;
                if !for_vmm && (offset % unit != 0 || len % unit != 0) {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        log::warn!(
                            "xemem: an attach of {len:#x} bytes at {gpa:#x} of an enclave whose RAM is on {} KiB pages refused (EINVAL): \
                             another process can map that memory only in whole pages; export segments of whole, aligned 2 MiB pages there \
                             (said once)",
                            unit / 1024
                        )
                    });
                    return Err(Error::WholePagesOnly);
                }
                out.push(FileRun::Memory { file, offset, len });
            }
        }
    }
    Ok(out)
}
