//! readv(fd, iov, iovcnt): `read` into each `struct iovec` in turn, stopping at a short read.

use super::read::read_at;
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
        let got = read_at(descriptor, base, len, None)?;
        total += got;
        if got < len {
            break;
        }
    }
    Ok(total)
}
