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

use enclave_proto::FileOp;

use super::{Enclave, JobSlot};
use crate::machine::RegionAccess;

/// Regions one job may have mapped at once: each is a memory slot of the machine, of which
/// KVM has a few hundred for everything.
const MAX_MAPPINGS: usize = 64;
const PAGE: u64 = 4096;

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
        slot.mapped.push(region);
        Ok(region.gpa as i64)
    }

    fn unmap_shared(&self, slot: &mut JobSlot, gpa: u64) -> Result<i64, i32> {
        let index = slot.mapped.iter().position(|region| region.gpa == gpa).ok_or(libc::EINVAL)?;
        let region = slot.mapped.swap_remove(index);
        self.release_regions(&[region]);
        Ok(0)
    }
}
