//! tgkill(tgid, tid, sig): a signal to one of the job's threads acts on the whole job.

use super::kill::signal_job;
use super::{Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    signal_job(call.args[1], call.args[2])
}
