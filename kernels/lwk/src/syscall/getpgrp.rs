//! getpgrp(): the caller's process group.

use super::{Call, SyscallResult};
use crate::process;

pub fn call(_call: &mut Call<'_>) -> SyscallResult {
    process::group_of(0).map(|(group, _)| group)
}
