//! What rustix does not offer: `setfsuid`/`setfsgid` (rustix has the process's and the
//! thread's real/effective/saved ids, not the file-system ids), so these stay on libc.

/// Makes this thread's file-system checks (and the owner of files it creates) those of
/// `uid`/`gid` until dropped, so a root daemon acting for a user cannot reach further than the
/// user could. `setfsuid`/`setfsgid` change only the calling thread; supplementary groups are
/// not taken on, which can only refuse more.
pub struct FsIdentity {
    previous_uid: u32,
    previous_gid: u32,
}

impl FsIdentity {
    pub fn assume(uid: u32, gid: u32) -> FsIdentity {
        // SAFETY: no pointers; the calls return the previous ids. The group goes first: once
        // the uid is unprivileged the gid could not be changed any more.
        unsafe {
            let previous_gid = libc::setfsgid(gid) as u32;
            let previous_uid = libc::setfsuid(uid) as u32;
            FsIdentity { previous_uid, previous_gid }
        }
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // SAFETY: as in `assume`, in reverse order.
        unsafe {
            libc::setfsuid(self.previous_uid);
            libc::setfsgid(self.previous_gid);
        }
    }
}
