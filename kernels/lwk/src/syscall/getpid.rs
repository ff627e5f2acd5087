//! getpid(): the job is process 1 of its enclave.

use super::{Call, SyscallResult};
use crate::job;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    Ok(job::PID)
}
