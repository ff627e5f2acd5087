//! rt_sigaction(sig, act, oldact, sigsetsize): handlers are recorded nowhere because no signal
//! is ever delivered to the job (faults end it, as with the default action); the old action
//! reads as SIG_DFL.

use super::{user, Call, Errno, SyscallResult};

const SIGKILL: u64 = 9;
const SIGSTOP: u64 = 19;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [signal, _action, old_action, set_size, ..] = call.args;
    if !(1..=64).contains(&signal) || set_size != 8 || (signal == SIGKILL || signal == SIGSTOP) && call.args[1] != 0 {
        return Err(Errno::EINVAL);
    }
    if old_action != 0 {
        user::write_words(old_action, &[0; 4])?; // handler, flags, restorer, mask
    }
    Ok(0)
}
