//! What rustix does not offer: `setfsuid`/`setfsgid` (rustix has the process's and the
//! thread's real/effective/saved ids, not the file-system ids) and the raw, per-thread
//! `setgroups`, so these stay on libc.

use std::io;

/// Makes this thread's file-system checks (and the owner of files it creates) those of a
/// user, with their primary and supplementary groups, until dropped, so a root daemon acting
/// for a user reaches exactly as far as the user would on the host.
///
/// `setfsuid`/`setfsgid` change only the calling thread, and so does the raw `setgroups`
/// system call (libc's wrapper would change every thread of the daemon).
pub struct FsIdentity {
    previous_uid: u32,
    previous_gid: u32,
    previous_groups: Vec<libc::gid_t>,
}

/// The raw, per-thread setgroups.
fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` ids from the slice we pass.
    match unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

impl FsIdentity {
    /// Takes on `uid`, `gid` and `groups` (the supplementary groups; the primary one need not
    /// be among them). Fails only if the groups cannot be set (an unprivileged daemon: then
    /// its own groups would count, so nothing is served).
    pub fn assume(uid: u32, gid: u32, groups: &[u32]) -> io::Result<FsIdentity> {
        // SAFETY: getgroups(0, NULL) only counts.
        let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        let mut previous_groups = vec![0; count.max(0) as usize];
        // SAFETY: the buffer holds `count` ids.
        let count = unsafe { libc::getgroups(count, previous_groups.as_mut_ptr()) };
        if count < 0 {
            return Err(io::Error::last_os_error());
        }
        previous_groups.truncate(count as usize);
        set_thread_groups(groups)?;
        // SAFETY: no pointers; the calls return the previous ids. The group goes first: once
        // the uid is unprivileged the gid could not be changed any more.
        let (previous_gid, previous_uid) = unsafe { (libc::setfsgid(gid) as u32, libc::setfsuid(uid) as u32) };
        Ok(FsIdentity { previous_uid, previous_gid, previous_groups })
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // SAFETY: as in `assume`, in reverse order.
        unsafe {
            libc::setfsuid(self.previous_uid);
            libc::setfsgid(self.previous_gid);
        }
        // Setting back groups we had cannot fail for want of privilege: fsuid is ours again.
        let _ = set_thread_groups(&self.previous_groups);
    }
}
