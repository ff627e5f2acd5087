//! The ioctl side of `/dev/xpmem`: XPMEM's command numbers and x86-64 argument layouts (as
//! `xemem/include/xpmem.h` declares them, checked there by static asserts), read from and
//! written back to the job's memory.

use super::Detached;
use crate::job::{self, descriptors::Descriptor};
use crate::linux::uapi;
use crate::syscall::user;
use crate::syscall::{Errno, Fd, SyscallResult, UserAddr};
use xemem::Error;

/// `_IO('x', n)`: XPMEM's commands are numbered from 0x7800.
const VERSION: u32 = 0x7800;
const MAKE: u32 = 0x7801;
const REMOVE: u32 = 0x7802;
const GET: u32 = 0x7803;
const RELEASE: u32 = 0x7804;
const ATTACH: u32 = 0x7805;
const DETACH: u32 = 0x7806;
/// XEMEM's extension: `_IO('x', 0x10)`, `struct xemem_cmd_make_named` in xpmem.h.
const MAKE_NAMED: u32 = 0x7810;
/// XEMEM's lookup: `_IO('x', 0x11)`, `struct xemem_cmd_lookup` in xpmem.h.
const LOOKUP: u32 = 0x7811;
/// XEMEM's signal: `_IO('x', 0x12)`, `struct xemem_cmd_signal` in xpmem.h.
const SIGNAL: u32 = 0x7812;
/// XEMEM's notification descriptor: `_IO('x', 0x13)`, `struct xemem_cmd_notify_fd`.
const NOTIFY_FD: u32 = 0x7813;
/// XEMEM's snapshots (xpmem.h): `struct xemem_cmd_region` for the first two,
/// `struct xemem_cmd_snapshot_make`, and `struct xemem_cmd_snapshot_release` (a segid).
const REGION_ALLOC: u32 = 0x7814;
const REGION_FREE: u32 = 0x7815;
const SNAPSHOT_MAKE: u32 = 0x7816;
const SNAPSHOT_RELEASE: u32 = 0x7817;
/// The flags `XEMEM_CMD_NOTIFY_FD` takes: Linux's O_NONBLOCK and O_CLOEXEC.
const O_NONBLOCK: u32 = uapi::O_NONBLOCK;
const O_CLOEXEC: u32 = uapi::O_CLOEXEC;
/// `XEMEM_NAME_MAX + 1`: the name field, NUL-terminated.
const NAME_FIELD: usize = 64;

/// `XPMEM_PERMIT_MODE`, the only permit type.
pub const PERMIT_MODE: u32 = 0x1;
/// `XPMEM_CURRENT_VERSION`: the XPMEM 2.6 user ABI, what the host library reports too.
const CURRENT_VERSION: u64 = 0x0002_6005;

fn errno(error: Error) -> Errno {
    Errno(error.errno() as u64)
}

/// The low and high `int` of a word holding two of them.
fn ints(word: u64) -> (u32, u32) {
    (word as u32, (word >> 32) as u32)
}

/// An ioctl on `fd` that only takes a parked attachment up again (an attach of its range, see
/// `super::resume_same`) or parks one (a detach, see `super::park_detached`), answered before
/// the general path looks up the descriptor and dispatches the command: in-situ analytics
/// repeat that attach and detach at every step, and on PVM every kernel instruction saved is
/// most of a microsecond. `None`: not such a command (or `fd` is not `/dev/xpmem`); the
/// general path answers it.
pub fn parking(fd: Fd, request: u32, argument: UserAddr) -> Option<SyscallResult> {
    match request {
        ATTACH => {
            // struct xpmem_cmd_attach, as below
            let [apid, offset, size, vaddr, _] = user::read_words::<5>(argument).ok()?;
            let address = super::resume_same(fd, apid as i64, offset, size, vaddr)?;
            Some(user::write_words(argument + 24, &[address]).map(|_| 0))
        }
        DETACH => {
            let [vaddr] = user::read_words::<1>(argument).ok()?;
            super::park_detached(fd, vaddr).then_some(Ok(0))
        }
        _ => None,
    }
}

pub fn ioctl(request: u32, argument: UserAddr) -> SyscallResult {
    match request {
        VERSION => Ok(CURRENT_VERSION),
        MAKE => {
            // struct xpmem_cmd_make { u64 vaddr; size_t size; int permit_type; u64 permit_value; s64 segid; }
            let [vaddr, size, permit_type, permit_value, _] = user::read_words::<5>(argument)?;
            let segid = super::make(vaddr, size, ints(permit_type).0, permit_value).map_err(errno)?;
            user::write_words(argument + 32, &[segid as u64]).map(|_| 0)
        }
        REMOVE => {
            let [segid] = user::read_words::<1>(argument)?;
            super::remove(segid as i64).map(|_| 0).map_err(errno)
        }
        GET => {
            // struct xpmem_cmd_get { s64 segid; int flags; int permit_type; u64 permit_value; s64 apid; }
            let [segid, flags_and_type, permit_value, _] = user::read_words::<4>(argument)?;
            let (flags, permit_type) = ints(flags_and_type);
            let apid = super::get(segid as i64, flags, permit_type, permit_value).map_err(errno)?;
            user::write_words(argument + 24, &[apid as u64]).map(|_| 0)
        }
        RELEASE => {
            let [apid] = user::read_words::<1>(argument)?;
            super::release(apid as i64).map(|_| 0).map_err(errno)
        }
        ATTACH => {
            // struct xpmem_cmd_attach { s64 apid; off_t offset; size_t size; u64 vaddr; int fd; int flags; }
            let [apid, offset, size, vaddr, _] = user::read_words::<5>(argument)?;
            let address = super::attach(apid as i64, offset, size, vaddr).map_err(errno)?;
            user::write_words(argument + 24, &[address]).map(|_| 0)
        }
        DETACH => {
            let [vaddr] = user::read_words::<1>(argument)?;
            match super::detach(vaddr) {
                Detached::Attachment | Detached::Nothing => Ok(0),
                Detached::NotAnAttachment => Err(Errno::EINVAL),
            }
        }
        MAKE_NAMED => {
            // struct xemem_cmd_make_named { u64 vaddr; u64 size; char name[64]; s64 segid; }
            let [vaddr, size] = user::read_words::<2>(argument)?;
            let field = user::read_bytes(argument + 16, NAME_FIELD)?;
            let length = field.iter().position(|&byte| byte == 0).ok_or(Errno::EINVAL)?;
            let name = xemem::wire::Name::new(&field[..length]).map_err(errno)?;
            let segid = super::make_named(vaddr, size, name).map_err(errno)?;
            user::write_words(argument + 16 + NAME_FIELD as u64, &[segid as u64]).map(|_| 0)
        }
        LOOKUP => {
            // struct xemem_cmd_lookup { char name[64]; s64 segid; }
            let field = user::read_bytes(argument, NAME_FIELD)?;
            let length = field.iter().position(|&byte| byte == 0).ok_or(Errno::EINVAL)?;
            let name = xemem::wire::Name::new(&field[..length]).map_err(errno)?;
            let segid = super::lookup(name).map_err(errno)?;
            user::write_words(argument + NAME_FIELD as u64, &[segid as u64]).map(|_| 0)
        }
        SIGNAL => {
            // struct xemem_cmd_signal { s64 apid; }
            let [apid] = user::read_words::<1>(argument)?;
            super::signal(apid as i64).map(|_| 0).map_err(errno)
        }
        NOTIFY_FD => {
            // struct xemem_cmd_notify_fd { s64 segid; int flags; int fd; }
            let [segid, flags_and_fd] = user::read_words::<2>(argument)?;
            let flags = ints(flags_and_fd).0;
            if flags & !(O_NONBLOCK | O_CLOEXEC) != 0 {
                return Err(Errno::EINVAL);
            }
            let notifier = super::notifier_of(segid as i64).map_err(errno)?;
            let descriptor = Descriptor::XpmemNotify { notifier, non_blocking: flags & O_NONBLOCK != 0 };
            let fd =
                job::with_process(|process| process.descriptors.insert_flagged(descriptor, flags & O_CLOEXEC != 0)).ok_or(Errno::EMFILE)?;
            match user::write_words(argument + 8, &[(flags as u64) | (u64::from(fd) << 32)]) {
                Ok(_) => Ok(0),
                Err(errno) => {
                    drop(job::with_process(|process| process.descriptors.remove(fd)));
                    Err(errno)
                }
            }
        }
        REGION_ALLOC => {
            // struct xemem_cmd_region { u64 size; u64 vaddr; }
            let [size] = user::read_words::<1>(argument)?;
            let start = super::region_alloc(size)?;
            match user::write_words(argument + 8, &[start]) {
                Ok(_) => Ok(0),
                Err(errno) => {
                    let _ = super::region_free(start);
                    Err(errno)
                }
            }
        }
        REGION_FREE => {
            let [_, start] = user::read_words::<2>(argument)?;
            super::region_free(start).map(|_| 0)
        }
        SNAPSHOT_MAKE => {
            // struct xemem_cmd_snapshot_make { u64 vaddr; int permit_type; int pad;
            // u64 permit_value; char name[64]; s64 segid; }: an empty name is none.
            let [vaddr, permit_type, permit_value] = user::read_words::<3>(argument)?;
            let field = user::read_bytes(argument + 24, NAME_FIELD)?;
            let length = field.iter().position(|&byte| byte == 0).ok_or(Errno::EINVAL)?;
            let name = match length {
                0 => None,
                _ => Some(xemem::wire::Name::new(&field[..length]).map_err(errno)?),
            };
            let segid = super::snapshot_make(vaddr, ints(permit_type).0, permit_value, name)?;
            match user::write_words(argument + 24 + NAME_FIELD as u64, &[segid as u64]) {
                Ok(_) => Ok(0),
                Err(errno) => {
                    let _ = super::snapshot_release(segid);
                    Err(errno)
                }
            }
        }
        SNAPSHOT_RELEASE => {
            let [segid] = user::read_words::<1>(argument)?;
            super::snapshot_release(segid as i64).map(|_| 0)
        }
        // FORK_BEGIN/FORK_END: every process has its own segments and attachments here, and a
        // fork child inherits none (nothing to track). Anything else: not a command.
        _ => Err(Errno::ENOTTY),
    }
}
