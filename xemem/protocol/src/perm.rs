//! Permission checks as SysV IPC does them (ipcperms): the owner's bits apply to the owner uid,
//! the group bits to members of the owner gid, the other bits to everyone else; uid 0 passes
//! (XPMEM lets CAP_IPC_OWNER through).

use crate::{Error, ACCESS_READ_ONLY, ACCESS_READ_WRITE};
use alloc::vec::Vec;

/// Who owns a segment and its mode (`0o000..=0o777`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// Who asks: the effective uid and every group (effective gid and supplementary groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub groups: Vec<u32>,
}

/// The largest group list a request may carry (Linux allows 65536; 64 covers real users and
/// keeps messages small).
pub const MAX_GROUPS: usize = 64;

pub const MAX_MODE: u32 = 0o777;

/// May `who` have `access` (`ACCESS_READ_ONLY` or `ACCESS_READ_WRITE`) to a segment of `owner`?
pub fn check(owner: &Owner, who: &Credentials, access: u32) -> Result<(), Error> {
    crate::validate_access_flags(access)?;
    if who.uid == 0 {
        return Ok(());
    }
    let bits = if who.uid == owner.uid {
        owner.mode >> 6
    } else if who.groups.contains(&owner.gid) {
        owner.mode >> 3
    } else {
        owner.mode
    } & 0o7;
    let needed = match access {
        ACCESS_READ_ONLY => 0o4,
        ACCESS_READ_WRITE => 0o6,
        _ => return Err(Error::Invalid),
    };
    if bits & needed == needed {
        Ok(())
    } else {
        Err(Error::Denied)
    }
}
