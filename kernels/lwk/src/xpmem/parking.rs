//! Parked attachments: a detach of an attachment of host-added memory keeps it, suspended, for
//! an attach of the same range to take up again without asking the host (see [`park`]).

use super::*;

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
pub(super) fn park(device: &mut Device, index: usize, descriptor: DeviceDescriptor) -> bool {
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
pub(super) enum DeviceDescriptor {
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
                DeviceDescriptor::Unchecked(fd) => {
                    process.descriptors.get(fd).is_some_and(|open| matches!(*open, job::descriptors::Descriptor::Xpmem))
                }
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
pub(super) fn drop_parked_where(device: &mut Device, which: impl Fn(&Attachment) -> bool) -> Vec<(u64, AccessId)> {
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
pub(super) fn drop_parked_in_the_way(device: &mut Device, pid: u64, apid: AccessId, size: u64, fixed: u64) -> Vec<(u64, AccessId)> {
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
pub(super) fn may_park(segment: SegmentId, with_word: bool) -> bool {
    segment.enclave() == xemem::ids::NAME_SERVER_ENCLAVE || with_word
}

/// The host's word (see [`may_park`]) as (guest-physical address, value), made readable
/// through the kernel's physical-memory window; `None` if it does not lie in a region the host
/// added (above RAM), 8-aligned.
pub(super) fn readable_word(word: xemem::wire::MappingWord) -> Option<(u64, u64)> {
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
