//! pause(): waits until a signal the thread takes arrives; returns EINTR once its handler
//! has run (a signal whose action is to ignore it does not wake the thread).

use super::{Call, SyscallResult};
use crate::sched;
use crate::signal::Restart;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    sched::wait_for_signal();
    Err(Restart::NoHandler.errno())
}
