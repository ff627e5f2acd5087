//! sigaltstack(ss, old_ss): the calling thread's alternate signal stack (`stack_t`: base,
//! flags, size), used by handlers installed with SA_ONSTACK. The entry code gives this call
//! a full frame: whether the caller runs on that stack depends on its stack pointer.

use super::{user, Call, Errno, SyscallResult};
use crate::signal::{self, AltStackError};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [new_stack, old_stack, ..] = call.args;
    let stack_pointer = call.frame.as_deref().ok_or(Errno::ENOSYS)?.rsp;
    let new = match new_stack {
        0 => None,
        address => {
            let [base, flags, size] = user::read_words::<3>(address)?;
            Some((base, flags & 0xffff_ffff, size))
        }
    };
    let old = signal::alt_stack(new, stack_pointer).map_err(|error| match error {
        AltStackError::OnStack => Errno::EPERM,
        AltStackError::TooSmall => Errno::ENOMEM,
        AltStackError::BadFlags => Errno::EINVAL,
    })?;
    if old_stack != 0 {
        user::write_words(old_stack, &[old.0, old.1, old.2])?;
    }
    Ok(0)
}
