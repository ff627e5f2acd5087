//! umask(mask): kept and returned (nothing is ever created: the file system is read-only).

use super::SyscallResult;
use core::sync::atomic::{AtomicU32, Ordering};

static MASK: AtomicU32 = AtomicU32::new(0o022);

pub fn umask(mask: u32) -> SyscallResult {
    Ok(MASK.swap(mask & 0o777, Ordering::Relaxed) as u64)
}
