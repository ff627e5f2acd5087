//! pipe(fds): `pipe2(fds, 0)`.

use super::{pipe2, Call, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    pipe2::make_pipe(call.args[0], 0)
}
