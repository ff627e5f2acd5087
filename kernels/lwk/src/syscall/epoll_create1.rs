//! epoll_create1(flags): a new epoll instance (`crate::job::epoll`) on the lowest free
//! descriptor. Flags: EPOLL_CLOEXEC; others EINVAL. EMFILE when the table is full.

use super::{Call, Errno, SyscallResult};
use crate::job::{self, descriptors::Descriptor, epoll::Epoll};
use alloc::sync::Arc;

const EPOLL_CLOEXEC: u64 = 0o2000000;
const EMFILE: Errno = Errno(24);

pub fn create(close_on_exec: bool) -> SyscallResult {
    let epoll = Arc::new(Epoll::new());
    job::with_process(|process| process.descriptors.insert_flagged(Descriptor::Epoll(epoll), close_on_exec)).ok_or(EMFILE)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let flags = call.args[0] as u32 as u64;
    if flags & !EPOLL_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    create(flags & EPOLL_CLOEXEC != 0)
}
