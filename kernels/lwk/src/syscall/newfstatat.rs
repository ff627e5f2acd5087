//! newfstatat(dirfd, path, statbuf, flags): a path of the job's file system, or with
//! AT_EMPTY_PATH and an empty path the descriptor itself (glibc's fstat). There are no
//! symbolic links, so AT_SYMLINK_NOFOLLOW changes nothing.

use super::fstat::{stat_descriptor, write_stat};
use super::{path, user, Call, SyscallResult};

const AT_EMPTY_PATH: u64 = 0x1000;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [directory, address, stat, flags, ..] = call.args;
    if flags & AT_EMPTY_PATH != 0 && user::read_path(address)?.is_empty() {
        return stat_descriptor(directory, stat);
    }
    if let Some(result) = super::openat::stat_on_host(directory, address, stat) {
        return result;
    }
    let node = path::lookup(&path::resolve(directory, address)?)?;
    write_stat(stat, &node)
}
