//! Who is on the other end of a client connection, and whether they may create enclaves
//! (root, or a member of the `clowder` group).

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

pub const ADMIN_GROUP: &str = "clowder";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    /// The primary group.
    pub gid: u32,
    /// Primary and supplementary groups.
    pub groups: Vec<u32>,
}

/// Reads the peer's credentials with SO_PEERCRED (the kernel's word, not the client's), and its
/// supplementary groups from /proc.
pub fn peer_of(stream: &UnixStream) -> io::Result<Peer> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into the ucred we own.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![credentials.gid];
    // The group list is best effort: a client that already exited has none to read, and then
    // only its primary group counts.
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", credentials.pid)) {
        if let Some(line) = status.lines().find_map(|l| l.strip_prefix("Groups:")) {
            groups.extend(line.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    Ok(Peer { pid: credentials.pid, uid: credentials.uid, gid: credentials.gid, groups })
}

/// The id of the `clowder` group from /etc/group, if it exists.
pub fn admin_group_id() -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == ADMIN_GROUP).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

/// Root and members of the admin group may create enclaves and run jobs (which create one).
pub fn may_create_enclaves(peer: &Peer, admin_group: Option<u32>) -> bool {
    peer.uid == 0 || admin_group.is_some_and(|gid| peer.groups.contains(&gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_the_group_may_create() {
        let user = |uid, groups: &[u32]| Peer { pid: 1, uid, gid: groups[0], groups: groups.to_vec() };
        assert!(may_create_enclaves(&user(0, &[0]), None));
        assert!(may_create_enclaves(&user(1000, &[1000, 977]), Some(977)));
        assert!(!may_create_enclaves(&user(1000, &[1000]), Some(977)));
        assert!(!may_create_enclaves(&user(1000, &[1000]), None));
    }

    #[test]
    fn credentials_come_from_the_kernel() {
        let (left, _right) = UnixStream::pair().unwrap();
        let peer = peer_of(&left).unwrap();
        assert_eq!(peer.pid as u32, std::process::id());
        // SAFETY: getuid has no preconditions.
        assert_eq!(peer.uid, unsafe { libc::getuid() });
    }
}
