//! brk(addr): moves the break inside the heap reserved at load; returns the new (or, if it
//! cannot move, the old) break, as Linux does.

use super::{Call, SyscallResult};
use crate::job;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    Ok(job::with_process(|process| process.memory.set_brk(call.args[0])))
}
