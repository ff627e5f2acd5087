//! epoll_create(size): `epoll_create1(0)`; `size` is only checked (> 0, else EINVAL), as on
//! Linux.

use super::{Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    if call.args[0] as i32 <= 0 {
        return Err(Errno::EINVAL);
    }
    super::epoll_create1::create(false)
}
