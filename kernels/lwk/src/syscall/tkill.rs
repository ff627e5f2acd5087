//! tkill(tid, sig): a signal to one of the job's threads.

use super::kill::send_to_thread;
use super::{Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    send_to_thread(call.args[0], call.args[1])
}
