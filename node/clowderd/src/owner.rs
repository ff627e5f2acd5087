//! Who owns an enclave and who else may touch it. A non-root user may use (run jobs in),
//! remove, and read the log of only the enclaves they created and those shared with a group
//! they are in; what a one-shot enclave's job runs only its owner sees. Root may do anything.

use clowder_api::{ApiError, ErrorKind};
use nix::unistd::{Gid, Group, Uid, User};

use crate::peer::Peer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    /// Members of this group may use and remove the enclave too.
    pub share_gid: Option<u32>,
}

impl Owner {
    /// The enclave belongs to `peer`, shared with nobody.
    pub fn of(peer: &Peer) -> Owner {
        Owner { uid: peer.uid, share_gid: None }
    }

    /// Whether `peer` may run jobs in the enclave, remove it and read its log.
    pub fn may_use(&self, peer: &Peer) -> bool {
        self.may_read(peer) || self.share_gid.is_some_and(|gid| peer.groups.contains(&gid))
    }

    /// Whether `peer` may see what a one-shot enclave's job runs (it is the owner's job).
    pub fn may_read(&self, peer: &Peer) -> bool {
        peer.uid == 0 || peer.uid == self.uid
    }

    /// Why `peer` may not `what` (e.g. "remove enclave sim"), which [`Owner::may_use`] forbids.
    pub fn use_refusal(&self, peer: &Peer, what: &str) -> String {
        let group = self.share_gid.map_or_else(String::new, |gid| format!(", members of group {}", group_name(gid)));
        format!(
            "permission denied: you (uid {}) may not {what}: it belongs to {} (uid {}); only its owner{group} and root may",
            peer.uid,
            user_name(self.uid),
            self.uid
        )
    }
}

/// A user's name, or their uid when they have none.
pub fn user_name(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

/// The search path a job gets when it names none: a login's on Debian.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// `env` with what a login gives `uid` and `env` leaves out: `HOME`, `USER`, `LOGNAME` and
/// `SHELL` from the password database, and `PATH`. Programs take them as given (ADIOS2 makes a
/// C++ string of `getenv("HOME")` and died of SIGSEGV in every enclave job), as sshd, login and
/// Slurm set them; what `env` names wins.
pub fn with_login_environment(env: Vec<String>, uid: u32) -> Vec<String> {
    let mut defaults = vec![format!("PATH={DEFAULT_PATH}")];
    if let Ok(Some(user)) = User::from_uid(Uid::from_raw(uid)) {
        defaults.push(format!("HOME={}", user.dir.display()));
        defaults.push(format!("USER={}", user.name));
        defaults.push(format!("LOGNAME={}", user.name));
        defaults.push(format!("SHELL={}", user.shell.display()));
    }
    add_missing(env, defaults)
}

/// `env` followed by those `defaults` whose names it does not set.
fn add_missing(mut env: Vec<String>, defaults: Vec<String>) -> Vec<String> {
    let name = |entry: &str| entry.split('=').next().unwrap_or("").to_string();
    let given: Vec<String> = env.iter().map(|entry| name(entry)).collect();
    env.extend(defaults.into_iter().filter(|entry| !given.contains(&name(entry))));
    env
}

/// A group's name, or its gid when it has none.
pub fn group_name(gid: u32) -> String {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(group)) => group.name,
        _ => gid.to_string(),
    }
}

/// The group `peer` shares an enclave with, named or numbered; they must be in it (root
/// need not be).
pub fn share_group(name: &str, peer: &Peer) -> Result<u32, ApiError> {
    let gid = match name.parse::<u32>() {
        Ok(gid) => gid,
        Err(_) => match Group::from_name(name) {
            Ok(Some(group)) => group.gid.as_raw(),
            Ok(None) => return Err(ApiError::new(ErrorKind::NotFound, format!("no group named {name:?} to share the enclave with"))),
            Err(e) => return Err(ApiError::new(ErrorKind::Internal, format!("looking up group {name:?}: {e}"))),
        },
    };
    if peer.uid != 0 && !peer.groups.contains(&gid) {
        return Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!("you (uid {}) are not in group {name}, so you cannot share an enclave with it", peer.uid),
        ));
    }
    Ok(gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, groups: &[u32]) -> Peer {
        Peer { pid: 1, uid, gid: uid, groups: groups.to_vec() }
    }

    #[test]
    fn the_owner_the_group_and_root_may_use_and_only_the_owner_and_root_read() {
        let private = Owner { uid: 1000, share_gid: None };
        let shared = Owner { uid: 1000, share_gid: Some(500) };
        let (alice, bob, root) = (user(1000, &[1000]), user(1001, &[1001, 500]), user(0, &[0]));
        assert!(private.may_use(&alice) && private.may_use(&root) && !private.may_use(&bob));
        assert!(shared.may_use(&bob), "bob is in the group it is shared with");
        assert!(!shared.may_read(&bob) && shared.may_read(&alice) && shared.may_read(&root));
        let refusal = private.use_refusal(&bob, "remove enclave sim");
        assert!(refusal.contains("uid 1001") && refusal.contains("(uid 1000)"), "{refusal}");
    }

    #[test]
    fn a_job_gets_a_logins_variables_unless_it_names_them() {
        let env = with_login_environment(vec!["HOME=/scratch".into(), "OMP_NUM_THREADS=2".into()], 0);
        assert_eq!(&env[..2], ["HOME=/scratch", "OMP_NUM_THREADS=2"]);
        assert!(!env[2..].iter().any(|entry| entry.starts_with("HOME=")), "{env:?}");
        assert!(env.contains(&"USER=root".to_string()) && env.contains(&"LOGNAME=root".to_string()), "{env:?}");
        assert!(env.iter().any(|entry| entry.starts_with("PATH=/")) && env.iter().any(|entry| entry.starts_with("SHELL=/")));
        // A uid with no account still gets a PATH, and nothing invented.
        let nobody_known = with_login_environment(Vec::new(), 3_999_999);
        assert_eq!(nobody_known, ["PATH=/usr/local/bin:/usr/bin:/bin"]);
    }

    #[test]
    fn a_share_group_must_be_ones_own() {
        assert_eq!(share_group("500", &user(1001, &[1001, 500])), Ok(500));
        let refused = share_group("500", &user(1002, &[1002])).unwrap_err();
        assert!(refused.kind == ErrorKind::PermissionDenied && refused.message.contains("not in group 500"), "{refused:?}");
        assert_eq!(share_group("500", &user(0, &[0])), Ok(500));
        assert!(share_group("no-such-group-here", &user(0, &[0])).unwrap_err().message.contains("no group named"));
    }
}
