//! newfstatat(dirfd, path, statbuf, flags): only `fstat` through AT_EMPTY_PATH (glibc's way of
//! calling fstat); there are no files yet.

use super::fstat::stat_descriptor;
use super::{user, Call, Errno, SyscallResult};

const AT_EMPTY_PATH: u64 = 0x1000;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [directory, path, stat, flags, ..] = call.args;
    let path = user::read_path(path)?;
    if path.is_empty() && flags & AT_EMPTY_PATH != 0 {
        stat_descriptor(directory, stat)
    } else {
        Err(Errno::ENOENT)
    }
}
