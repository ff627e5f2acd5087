//! rt_sigreturn(): a signal handler returned through its restorer; the interrupted context
//! comes back from the frame `crate::signal` built (the entry code gives this call a full
//! frame).

use super::{Call, Errno, SyscallResult};
use crate::signal;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let frame = call.frame.as_deref_mut().ok_or(Errno::ENOSYS)?;
    Ok(signal::return_from_handler(frame))
}
