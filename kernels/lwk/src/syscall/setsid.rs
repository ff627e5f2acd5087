//! setsid(): the caller leads a new session and group; EPERM if it leads a group already.

use super::{Call, SyscallResult};
use crate::process;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    process::new_session()
}
