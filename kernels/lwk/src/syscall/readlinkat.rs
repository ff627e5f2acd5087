//! readlinkat(dirfd, path, buf, size): as `readlink` (the only link is absolute).

use super::readlink::read_link;
use super::{Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    read_link(call.args[1], call.args[2], call.args[3])
}
