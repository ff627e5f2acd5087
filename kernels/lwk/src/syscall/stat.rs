//! stat(path, statbuf): a path of the job's file system.

use super::fstat::write_stat;
use super::{openat, path, Call, SyscallResult};

const AT_FDCWD: u64 = -100i64 as u64;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    if let Some(result) = openat::stat_on_host(AT_FDCWD, call.args[0], call.args[1]) {
        return result;
    }
    let node = path::lookup(&path::resolve(AT_FDCWD, call.args[0])?)?;
    write_stat(call.args[1], &node)
}
