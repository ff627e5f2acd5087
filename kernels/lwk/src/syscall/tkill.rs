//! tkill(tid, sig): as `tgkill`.

use super::kill::signal_job;
use super::{Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    signal_job(call.args[0], call.args[1])
}
