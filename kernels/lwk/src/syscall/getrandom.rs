//! getrandom(buf, len, flags): RDRAND when the CPU has it, else a TSC-seeded generator;
//! never blocks.

use super::{user, Call, Errno, SyscallResult};
use crate::job::random_bytes;

const GRND_NONBLOCK: u64 = 1;
const GRND_RANDOM: u64 = 2;
const GRND_INSECURE: u64 = 4;
const MAX_BYTES: u64 = 32 << 20;

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [buffer, len, flags, ..] = call.args;
    if flags & !(GRND_NONBLOCK | GRND_RANDOM | GRND_INSECURE) != 0 {
        return Err(Errno::EINVAL);
    }
    let len = len.min(MAX_BYTES);
    let mut offset = 0;
    while offset < len {
        let bytes = random_bytes();
        let chunk = (len - offset).min(bytes.len() as u64);
        user::write_bytes(buffer + offset, &bytes[..chunk as usize])?;
        offset += chunk;
    }
    Ok(len)
}
