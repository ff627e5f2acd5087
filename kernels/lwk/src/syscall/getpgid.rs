//! getpgid(pid): the process group of `pid` (0: the caller); ESRCH if there is no such
//! process.

use super::{Call, SyscallResult};
use crate::process;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    process::group_of(call.args[0] as u32 as u64).map(|(group, _)| group)
}
