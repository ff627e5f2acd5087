//! lstat(path, statbuf): as `stat` (there are no symbolic links).

use super::{stat, Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    stat::call(call)
}
