//! exit_group(status): ends the calling process, all its threads, with the status's low eight
//! bits; for the job's first process that ends the job (the VM's exit status, or the job's
//! status sent to the host).

use super::{Call, SyscallResult};
use crate::process;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    process::exit_group(call.args[0] as u8)
}
