//! getrandom(buf, len, flags): RDRAND when the CPU has it, else a TSC-seeded generator;
//! never blocks. Flags: GRND_NONBLOCK, GRND_RANDOM and GRND_INSECURE are accepted (there is
//! nothing to wait for); others EINVAL, as on Linux.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::job::random_bytes;
use crate::linux_consts;

linux_consts!(u32: GRND_NONBLOCK, GRND_RANDOM, GRND_INSECURE);
const MAX_BYTES: u64 = 32 << 20;

pub fn getrandom(buffer: UserAddr, len: usize, flags: u32) -> SyscallResult {
    if flags & !(GRND_NONBLOCK | GRND_RANDOM | GRND_INSECURE) != 0 {
        return Err(Errno::EINVAL);
    }
    let len = (len as u64).min(MAX_BYTES);
    let mut offset = 0;
    while offset < len {
        let bytes = random_bytes();
        let chunk = (len - offset).min(bytes.len() as u64);
        user::write_bytes(buffer + offset, &bytes[..chunk as usize])?;
        offset += chunk;
    }
    Ok(len)
}
