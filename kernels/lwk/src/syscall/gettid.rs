//! gettid(): the calling thread's id (the main thread's is the process id).

use super::{Call, SyscallResult};
use crate::sched;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    Ok(sched::current_tid())
}
