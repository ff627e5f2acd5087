//! uname(buf): six 65-byte fields. The release is a Linux version recent enough for glibc's
//! and musl's checks; the version names this kernel.

use super::{user, SyscallResult, UserAddr};

const FIELD: usize = 65;

pub fn uname(address: UserAddr) -> SyscallResult {
    let fields = ["Linux", "lwk", "6.1.0-lwk", "#1 clowder lightweight kernel", "x86_64", "(none)"];
    let mut record = [0u8; FIELD * 6];
    for (slot, text) in record.chunks_mut(FIELD).zip(fields) {
        slot[..text.len()].copy_from_slice(text.as_bytes());
    }
    user::write_bytes(address, &record)?;
    Ok(0)
}
