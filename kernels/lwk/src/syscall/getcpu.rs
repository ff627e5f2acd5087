//! getcpu(cpu, node, cache): the CPU the caller runs on (one NUMA node, 0).

use super::{user, Call, SyscallResult};
use crate::arch::tables;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [cpu, node, ..] = call.args;
    if cpu != 0 {
        user::write_bytes(cpu, &(tables::current_cpu() as u32).to_le_bytes())?;
    }
    if node != 0 {
        user::write_bytes(node, &0u32.to_le_bytes())?;
    }
    Ok(0)
}
