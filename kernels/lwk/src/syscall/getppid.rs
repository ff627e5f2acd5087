//! getppid(): the parent of the calling process (0 for the job's first process, whose parent
//! is outside the enclave; orphans belong to the first process).

use super::{Call, SyscallResult};
use crate::{process, sched};

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    Ok(process::parent_of(sched::current_pid()))
}
