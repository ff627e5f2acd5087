//! writev(fd, iov, iovcnt): each `struct iovec { base, len }` in turn, as `write`.

use super::write::write_to_descriptor;
use super::{user, Call, Errno, SyscallResult};

const IOV_MAX: u64 = 1024;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [descriptor, vector, count, ..] = call.args;
    if count > IOV_MAX {
        return Err(Errno::EINVAL);
    }
    let mut total = 0;
    for index in 0..count {
        let [base, len] = user::read_words::<2>(vector + index * 16)?;
        if len > 0 {
            total += write_to_descriptor(descriptor, base, len)?;
        }
    }
    Ok(total)
}
