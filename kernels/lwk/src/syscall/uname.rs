//! uname(buf): six 65-byte fields. The release is a Linux version recent enough for glibc's
//! and musl's checks; the version names this kernel.

use super::{user, SyscallResult, UserAddr};
use crate::linux::new_utsname;
use core::mem::{offset_of, size_of};

pub fn uname(address: UserAddr) -> SyscallResult {
    let fields = [
        (offset_of!(new_utsname, sysname), "Linux"),
        (offset_of!(new_utsname, nodename), "lwk"),
        (offset_of!(new_utsname, release), "6.1.0-lwk"),
        (offset_of!(new_utsname, version), "#1 clowder lightweight kernel"),
        (offset_of!(new_utsname, machine), "x86_64"),
        (offset_of!(new_utsname, domainname), "(none)"),
    ];
    let mut record = [0u8; size_of::<new_utsname>()];
    for (at, text) in fields {
        record[at..at + text.len()].copy_from_slice(text.as_bytes());
    }
    user::write_bytes(address, &record)?;
    Ok(0)
}
