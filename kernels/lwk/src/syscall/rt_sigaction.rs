//! rt_sigaction(sig, act, oldact, sigsetsize): records the action (handler, flags, restorer,
//! mask) that `crate::signal` uses to deliver `sig`; SIGKILL and SIGSTOP cannot be caught.

use super::{user, Call, Errno, SyscallResult};
use crate::signal::{self, Action, SIGKILL, SIGSTOP};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [signal, new_action, old_action, set_size, ..] = call.args;
    if !(1..=64).contains(&signal) || set_size != 8 {
        return Err(Errno::EINVAL);
    }
    let signal = signal as u8;
    let requested = match new_action {
        0 => None,
        address => {
            let [handler, flags, restorer, mask] = user::read_words::<4>(address)?;
            if signal == SIGKILL || signal == SIGSTOP {
                return Err(Errno::EINVAL);
            }
            Some(Action { handler, flags, restorer, mask })
        }
    };
    let old = match requested {
        Some(action) => signal::set_action(signal, action),
        None => signal::action(signal),
    };
    if old_action != 0 {
        user::write_words(old_action, &[old.handler, old.flags, old.restorer, old.mask])?;
    }
    Ok(0)
}
