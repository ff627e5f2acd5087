//! umask(mask): kept and returned (nothing is ever created: the file system is read-only).

use super::{Call, SyscallResult};
use core::sync::atomic::{AtomicU64, Ordering};

static MASK: AtomicU64 = AtomicU64::new(0o022);

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    Ok(MASK.swap(call.args[0] & 0o777, Ordering::Relaxed))
}
