//! readlink(path, buf, size): only `/proc/self/exe`, which names the job's argv[0] (libc
//! asks for it at start-up).

use super::{user, Call, Errno, SyscallResult};
use crate::job;

pub fn read_link(path: u64, buffer: u64, size: u64) -> SyscallResult {
    if size == 0 || size > i32::MAX as u64 {
        return Err(Errno::EINVAL);
    }
    if user::read_path(path)? != "/proc/self/exe" {
        return Err(Errno::ENOENT);
    }
    let target = job::with_process(|process| process.executable_path.clone());
    let len = target.len().min(size as usize);
    user::write_bytes(buffer, &target.as_bytes()[..len])?;
    Ok(len as u64)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    read_link(call.args[0], call.args[1], call.args[2])
}
