//! gettid(): the main thread's id is the process id.

use super::{Call, SyscallResult};
use crate::job;

pub fn call(_call: &mut Call) -> SyscallResult {
    Ok(job::PID)
}
