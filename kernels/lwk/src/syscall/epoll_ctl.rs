//! epoll_ctl(epfd, op, fd, event): EPOLL_CTL_ADD, EPOLL_CTL_MOD, EPOLL_CTL_DEL of an interest
//! in open file `fd` (`struct epoll_event`: u32 events, u64 data, packed in 12 bytes; not read
//! for DEL, which accepts NULL). Checked in Linux's order: the event's address (EFAULT), both
//! descriptors (EBADF), a target without a poll method (regular files, directories, host
//! files, `/dev/xpmem`: EPERM), `fd` naming the instance itself or `epfd` not an epoll
//! instance (EINVAL), EPOLLEXCLUSIVE misuse (with MOD, on an epoll target, or with bits outside
//! Linux's `EPOLLEXCLUSIVE_OK_BITS`: EINVAL), a nesting loop or depth (ELOOP), then the
//! operation (ADD of a present interest EEXIST; MOD or DEL of an absent one ENOENT; another op
//! EINVAL).
//!
//! Flags: EPOLLET (edge-triggered: reported once per change of the file that wakes Linux's
//! waiters: each write for a pipe's read end, a read that makes room in a full pipe for its
//! write end, an end closing for both, each signal for an XEMEM notify descriptor, a change of
//! any of its files for an epoll instance) and EPOLLONESHOT (reported once, then disabled
//! until MOD) are implemented; EPOLLEXCLUSIVE is accepted with ADD (it only spreads Linux's
//! wake-ups over several epoll instances); EPOLLWAKEUP is dropped, as Linux does for a caller
//! without CAP_BLOCK_SUSPEND; EPOLLRDHUP may be asked for and is never reported (Linux
//! reports it for sockets only).
//!
//! An epoll instance may watch another (readable while the inner one has an event due), as on
//! Linux: a cycle, or more than 4 instances nested below the added one, is ELOOP (Linux's
//! `ep_loop_check` also counts the levels above the instance added to: not here).

use super::{user, Call, Errno, SyscallResult};
use crate::job::{self, descriptors::Descriptor, epoll};
use alloc::sync::Arc;

const EPOLL_CTL_ADD: u64 = 1;
const EPOLL_CTL_DEL: u64 = 2;
const EPOLL_CTL_MOD: u64 = 3;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [epfd, op, fd, event, ..] = call.args;
    let (op, fd_number) = (op as u32 as u64, fd as u32);
    let (mut events, data) = if op != EPOLL_CTL_DEL {
        let bytes = user::read_bytes(event, 12)?;
        (u32::from_le_bytes(bytes[0..4].try_into().unwrap()), u64::from_le_bytes(bytes[4..12].try_into().unwrap()))
    } else {
        (0, 0)
    };
    let (instance_file, file, watch) = job::with_process(|process| {
        let instance_file = process.descriptors.open_file(epfd).ok_or(Errno::EBADF)?;
        let file = process.descriptors.open_file(fd).ok_or(Errno::EBADF)?;
        let (watch, can_watch) = {
            let target = file.lock();
            (epoll::Watch::of(&target), epoll::can_watch(&target))
        };
        if !can_watch {
            return Err(Errno::EPERM);
        }
        Ok((instance_file, file, watch))
    })?;
    events &= !epoll::EPOLLWAKEUP;
    // Not the epoll instance itself (whatever descriptor names it).
    let instance = match &*instance_file.lock() {
        Descriptor::Epoll(instance) if !Arc::ptr_eq(&instance_file, &file) => instance.clone(),
        _ => return Err(Errno::EINVAL),
    };
    drop(instance_file);
    let exclusive = events & epoll::EPOLLEXCLUSIVE != 0;
    if exclusive && (op == EPOLL_CTL_MOD || (op == EPOLL_CTL_ADD && (events & !epoll::EXCLUSIVE_OK_BITS != 0 || matches!(watch, epoll::Watch::Epoll(_))))) {
        return Err(Errno::EINVAL);
    }
    let result = match (op, &watch) {
        (EPOLL_CTL_ADD, epoll::Watch::Epoll(inner)) => {
            let _nesting = epoll::NESTING.lock();
            inner.check_nesting(&instance, 1).and_then(|()| instance.add(fd_number, &file, watch.clone(), events, data))
        }
        (EPOLL_CTL_ADD, _) => instance.add(fd_number, &file, watch, events, data),
        (EPOLL_CTL_MOD, _) => instance.modify(fd_number, &file, events, data),
        (EPOLL_CTL_DEL, _) => instance.remove(fd_number, &file),
        _ => Err(Errno::EINVAL),
    };
    // `file` may be the last handle on the open file now (another thread closed it): it goes
    // here, with no lock held.
    drop(file);
    result.map(|()| 0)
}
