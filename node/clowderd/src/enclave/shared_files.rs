//! `mmap(MAP_SHARED)` of host files by enclave jobs (`FileOp::MapShared`): the file's own
//! pages become a guest-physical region of the enclave's machine, which the kernel maps into
//! the process. Ranks in this enclave, in other enclaves and on the host thus share one copy
//! of a `/dev/shm` or temporary file coherently, with no kernel on the data path (`shm_open`,
//! Open MPI's shared-memory transport, UCX's posix one).
//!
//! The file is one the job opened, with its user's rights; a writable mapping needs it open
//! for writing (`EACCES`, as Linux says). The range must lie within the file (its last page
//! rounded up): a page past the end would fault the whole machine on the host (SIGBUS in the
//! VMM), where Linux faults only the process, so it is refused (`EINVAL`, logged).
//!
//! The file may be truncated on the host while mapped. Each mapped file's size is looked at
//! before the job's file calls are answered and, between them, by the pump every
//! [`TRUNCATION_CHECK`]; the kernel is told which tail of the region went away
//! (`HostMessage::SharedFileTruncated`); the kernel unmaps it, so the job's next touch there
//! is SIGBUS as on Linux. A touch racing that message reads the zero pages the VMM puts over
//! the tail (its own once-a-second watch): the job never hangs on the missing pages. A stat
//! per mapped file is cheaper and simpler than an inotify watch per file, and the files are
//! few (at most [`MAX_MAPPINGS`] a job).

use std::fs::File;
use std::time::Duration;

use enclave_proto::{FileOp, HostMessage};

use super::{Enclave, JobSlot};
use crate::machine::{RegionAccess, SharedRegion};

/// Regions one job may have mapped at once: each is a memory slot of the machine, of which
/// KVM has a few hundred for everything.
const MAX_MAPPINGS: usize = 64;
const PAGE: u64 = 4096;
/// How often the pump looks for mapped files truncated on the host.
pub(super) const TRUNCATION_CHECK: Duration = Duration::from_millis(20);

/// A host file range a job maps shared, as a region of the machine.
pub(super) struct MappedFile {
    pub(super) region: SharedRegion,
    /// The job's open file (a copy of its descriptor: the job may close its own).
    file: File,
    offset: u64,
    /// Bytes of the region, from its start, the kernel was not told are gone.
    backed: u64,
}

impl Enclave {
    /// Serves `MapShared` and `UnmapShared` for `job` (in `slot`): the result to send, or
    /// `None` for any other call.
    pub(super) fn serve_shared_mapping(&self, job: u32, slot: &mut JobSlot, op: &FileOp<'_>) -> Option<i64> {
        let result = match *op {
            FileOp::MapShared { handle, offset, len, writable } => self.map_shared(job, slot, handle, offset, len, writable),
            FileOp::UnmapShared { gpa } => self.unmap_shared(slot, gpa),
            _ => return None,
        };
        Some(result.unwrap_or_else(|errno| -(errno as i64)))
    }

    fn map_shared(&self, job: u32, slot: &mut JobSlot, handle: u32, offset: u64, len: u64, writable: bool) -> Result<i64, i32> {
        let file = slot.files.handle(handle)?;
        // SAFETY: F_GETFL on a descriptor this function borrows; no memory is passed.
        let flags = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), libc::F_GETFL) };
        if flags < 0 {
            return Err(libc::EBADF);
        }
        if writable && flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(libc::EACCES);
        }
        let size = file.metadata().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?.len();
        let end = offset.checked_add(len);
        if len == 0 || offset % PAGE != 0 || len % PAGE != 0 || end.is_none_or(|end| end > size.next_multiple_of(PAGE)) {
            self.log.push(format!(
                "clowderd: job {job}: MAP_SHARED of {len:#x} bytes at offset {offset:#x} of a {size}-byte file refused: only whole pages within the file can be shared"
            ));
            return Err(libc::EINVAL);
        }
        if slot.mapped.len() >= MAX_MAPPINGS {
            self.log.push(format!("clowderd: job {job}: MAP_SHARED refused: the job already maps {MAX_MAPPINGS} host files"));
            return Err(libc::ENOMEM);
        }
        let access = if writable { RegionAccess::ReadWrite } else { RegionAccess::ReadOnly };
        let region = self.machine.lock().unwrap().add_region_range(file, offset, len, access).map_err(|e| {
            self.log.push(format!("clowderd: job {job}: MAP_SHARED of a host file ({len:#x} bytes) as a region: {e}"));
            libc::ENOMEM
        })?;
        match file.try_clone() {
            Ok(file) => slot.mapped.push(MappedFile { region, file, offset, backed: len }),
            Err(e) => {
                self.release_regions(&[region]);
                self.log.push(format!("clowderd: job {job}: MAP_SHARED of a host file: cannot keep its descriptor: {e}"));
                return Err(e.raw_os_error().unwrap_or(libc::EMFILE));
            }
        }
        Ok(region.gpa as i64)
    }

    fn unmap_shared(&self, slot: &mut JobSlot, gpa: u64) -> Result<i64, i32> {
        let index = slot.mapped.iter().position(|mapped| mapped.region.gpa == gpa).ok_or(libc::EINVAL)?;
        let mapped = slot.mapped.swap_remove(index);
        self.release_regions(&[mapped.region]);
        Ok(0)
    }

    /// Tells the kernel about every mapped file of every job that shrank since the last look.
    /// An error means the channel is broken.
    pub(super) fn report_truncated_files(&self) -> Result<(), String> {
        let gone: Vec<_> = self.jobs.lock().unwrap().iter_mut().flat_map(|(&job, slot)| self.truncated_tails(job, slot)).collect();
        self.send_truncated_tails(gone)
    }

    /// Tells the kernel which tails of `job`'s mapped files' regions went away since the last
    /// look: the pages past each file's new end (its last page rounded up, as Linux keeps the
    /// page holding the end).
    pub(super) fn truncated_tails(&self, job: u32, slot: &mut JobSlot) -> Vec<(u64, u64)> {
        let mut gone = Vec::new();
        for mapped in &mut slot.mapped {
            let Ok(size) = mapped.file.metadata().map(|metadata| metadata.len()) else { continue };
            let end = size.next_multiple_of(PAGE).saturating_sub(mapped.offset).min(mapped.backed);
            if end < mapped.backed {
                let name = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&mapped.file)));
                self.log.push(format!(
                    "clowderd: job {job}: {} was truncated to {size} bytes under its MAP_SHARED mapping: a touch past the end is SIGBUS",
                    name.map_or_else(|_| "a mapped file".into(), |path| path.display().to_string())
                ));
                gone.push((mapped.region.gpa + end, mapped.backed - end));
                mapped.backed = end;
            }
        }
        gone
    }

    /// Sends `SharedFileTruncated` for each of `gone`'s guest-physical ranges.
    pub(super) fn send_truncated_tails(&self, gone: Vec<(u64, u64)>) -> Result<(), String> {
        gone.into_iter().try_for_each(|(gpa, len)| self.send(&HostMessage::SharedFileTruncated { gpa, len }))
    }
}
