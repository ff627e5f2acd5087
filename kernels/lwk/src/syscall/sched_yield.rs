//! sched_yield(): the job's only thread owns the CPU, so there is nobody to yield to.

use super::{Call, SyscallResult};

pub fn call(_call: &mut Call) -> SyscallResult {
    Ok(0)
}
