//! rt_sigprocmask(how, set, oldset, sigsetsize): the mask is kept, so a later call reads back
//! what was set, but with no signal delivery it has no other effect.

use super::{user, Call, Errno, SyscallResult};
use core::sync::atomic::{AtomicU64, Ordering};

static MASK: AtomicU64 = AtomicU64::new(0);
const SIG_BLOCK: u64 = 0;
const SIG_UNBLOCK: u64 = 1;
const SIG_SETMASK: u64 = 2;
/// SIGKILL and SIGSTOP cannot be blocked.
const UNBLOCKABLE: u64 = 1 << 8 | 1 << 18;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [how, set, old_set, set_size, ..] = call.args;
    if set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let old = MASK.load(Ordering::Relaxed);
    if set != 0 {
        let [requested] = user::read_words::<1>(set)?;
        let new = match how {
            SIG_BLOCK => old | requested,
            SIG_UNBLOCK => old & !requested,
            SIG_SETMASK => requested,
            _ => return Err(Errno::EINVAL),
        };
        MASK.store(new & !UNBLOCKABLE, Ordering::Relaxed);
    }
    if old_set != 0 {
        user::write_words(old_set, &[old])?;
    }
    Ok(0)
}
