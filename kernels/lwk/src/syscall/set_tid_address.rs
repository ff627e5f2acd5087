//! set_tid_address(tidptr): the word zeroed and woken when the calling thread exits; returns
//! the caller's thread id.

use super::{Call, SyscallResult};
use crate::sched;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    sched::set_clear_child_tid(call.args[0]);
    Ok(sched::current_tid())
}
