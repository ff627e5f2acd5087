//! pread64(fd, buf, count, offset): a read at `offset` that leaves the file offset alone.

use super::read::read_at;
use super::{Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [descriptor, buffer, len, offset, ..] = call.args;
    if (offset as i64) < 0 {
        return Err(Errno::EINVAL);
    }
    read_at(descriptor, buffer, len, Some(offset))
}
