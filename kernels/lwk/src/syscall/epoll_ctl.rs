//! epoll_ctl(epfd, op, fd, event): EPOLL_CTL_ADD, EPOLL_CTL_MOD, EPOLL_CTL_DEL of an interest
//! in open file `fd` (`struct epoll_event`: u32 events, u64 data, packed in 12 bytes; not read
//! for DEL, which accepts NULL). Checked in Linux's order: the event's address (EFAULT), both
//! descriptors (EBADF), a target without a poll method (regular files, directories, host
//! files, `/dev/xpmem`: EPERM), `fd == epfd` or `epfd` not an epoll instance (EINVAL),
//! EPOLLEXCLUSIVE misuse (with MOD, or with bits outside Linux's `EPOLLEXCLUSIVE_OK_BITS`:
//! EINVAL), then the operation (ADD of a present interest EEXIST; MOD or DEL of an absent one
//! ENOENT; another op EINVAL).
//!
//! Flags: EPOLLET (edge-triggered: reported once per change of the file, as Linux's wake-ups:
//! a pipe's read end after each write or its last writer's close, its write end after each
//! read or its last reader's close, an XEMEM notify descriptor after each signal) and
//! EPOLLONESHOT (reported once, then disabled until MOD) are implemented; EPOLLEXCLUSIVE is
//! accepted with ADD (it only spreads Linux's wake-ups over several epoll instances);
//! EPOLLWAKEUP is dropped, as Linux does for a caller without CAP_BLOCK_SUSPEND; EPOLLRDHUP
//! may be asked for and is never reported (Linux reports it for sockets only). An epoll
//! descriptor cannot be added to an epoll instance here (EINVAL, logged once): Linux's nested
//! sets are not implemented.

use super::{user, Call, Errno, SyscallResult};
use crate::console::log;
use crate::job::{self, descriptors::Descriptor, epoll};
use core::sync::atomic::{AtomicBool, Ordering};

const EPOLL_CTL_ADD: u64 = 1;
const EPOLL_CTL_DEL: u64 = 2;
const EPOLL_CTL_MOD: u64 = 3;

static NESTING_REPORTED: AtomicBool = AtomicBool::new(false);

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [epfd, op, fd, event, ..] = call.args;
    let (op, fd_number) = (op as u32 as u64, fd as u32);
    let (mut events, data) = if op != EPOLL_CTL_DEL {
        let bytes = user::read_bytes(event, 12)?;
        (u32::from_le_bytes(bytes[0..4].try_into().unwrap()), u64::from_le_bytes(bytes[4..12].try_into().unwrap()))
    } else {
        (0, 0)
    };
    let (instance, file, watch, target_is_epoll) = job::with_process(|process| {
        let instance = process.descriptors.open_file(epfd).ok_or(Errno::EBADF)?;
        let file = process.descriptors.open_file(fd).ok_or(Errno::EBADF)?;
        let (watch, can_watch, target_is_epoll) = {
            let target = file.lock();
            (epoll::Watch::of(&target), epoll::can_watch(&target), matches!(*target, Descriptor::Epoll(_)))
        };
        if !can_watch {
            return Err(Errno::EPERM);
        }
        let instance = match &*instance.lock() {
            Descriptor::Epoll(instance) => Some(instance.clone()),
            _ => None,
        };
        Ok((instance, file, watch, target_is_epoll))
    })?;
    events &= !epoll::EPOLLWAKEUP;
    let instance = match instance {
        Some(instance) if epfd as u32 != fd_number => instance,
        _ => return Err(Errno::EINVAL),
    };
    if events & epoll::EPOLLEXCLUSIVE != 0 && (op == EPOLL_CTL_MOD || (op == EPOLL_CTL_ADD && events & !epoll::EXCLUSIVE_OK_BITS != 0)) {
        return Err(Errno::EINVAL);
    }
    let result = match op {
        EPOLL_CTL_ADD if target_is_epoll => {
            if !NESTING_REPORTED.swap(true, Ordering::Relaxed) {
                log!("epoll_ctl: an epoll descriptor inside an epoll set is not supported: returning EINVAL");
            }
            Err(Errno::EINVAL)
        }
        EPOLL_CTL_ADD => instance.add(fd_number, &file, watch, events, data),
        EPOLL_CTL_MOD => instance.modify(fd_number, &file, events, data),
        EPOLL_CTL_DEL => instance.remove(fd_number, &file),
        _ => Err(Errno::EINVAL),
    };
    // `file` may be the last handle on the open file now (another thread closed it): it goes
    // here, with no lock held.
    drop(file);
    result.map(|()| 0)
}
