//! Admission to the daemon's sockets (the API's and the XEMEM broker's): each user but root
//! holds a bounded number of connections, all users but root together a bounded number, and
//! accept or thread-start failures are waited out with back-off instead of ending a loop.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many connections a socket admits.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Open connections of one user (root is not limited).
    pub per_user: usize,
    /// Open connections of all users but root together.
    pub total: usize,
}

/// The open connections of each user but root on one socket, named `service` in refusals.
pub struct Admissions {
    service: &'static str,
    limits: ConnectionLimits,
    open: Mutex<HashMap<u32, usize>>,
}

/// One admitted connection; gives its place back when dropped.
pub struct Admission {
    admissions: Arc<Admissions>,
    uid: u32,
}

impl Admissions {
    pub fn new(service: &'static str, limits: ConnectionLimits) -> Arc<Admissions> {
        Arc::new(Admissions { service, limits, open: Mutex::new(HashMap::new()) })
    }

    /// Admits a connection of `uid` (root always, without counting), or says why not.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Option<Admission>, String> {
        if uid == 0 {
            return Ok(None);
        }
        let ConnectionLimits { per_user, total } = self.limits;
        let service = self.service;
        let mut open = self.open.lock().unwrap();
        let all: usize = open.values().sum();
        let mine = open.get(&uid).copied().unwrap_or(0);
        if mine >= per_user {
            return Err(format!(
                "too many connections: uid {uid} already has {mine} open to {service} (at most {per_user}); close some and retry"
            ));
        }
        if all >= total {
            return Err(format!("{service} is serving its limit of {total} connections; retry later"));
        }
        *open.entry(uid).or_default() += 1;
        Ok(Some(Admission { admissions: self.clone(), uid }))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut open = self.admissions.open.lock().unwrap();
        if let Some(count) = open.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

/// Waits after accept or thread-spawn failures, longer while they go on, so a shortage of
/// descriptors or threads is waited out rather than spun on or given up to.
pub struct Backoff {
    service: &'static str,
    delay: Duration,
    failures: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const LONGEST: Duration = Duration::from_secs(1);

    pub fn new(service: &'static str) -> Backoff {
        Backoff { service, delay: Backoff::FIRST, failures: 0 }
    }

    pub fn failed(&mut self, what: &str, error: &io::Error) {
        if self.failures == 0 {
            log::warn!("{what} on {}: {error}; retrying with back-off", self.service);
        }
        self.failures += 1;
        std::thread::sleep(self.delay);
        self.delay = (self.delay * 2).min(Backoff::LONGEST);
    }

    pub fn succeeded(&mut self) {
        if self.failures > 0 {
            log::info!("accepting clients on {} again after {} failures", self.service, self.failures);
            *self = Backoff::new(self.service);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_user_and_all_users_are_bounded_and_root_is_not() {
        let admissions = Admissions::new("the test socket", ConnectionLimits { per_user: 2, total: 3 });
        let first = admissions.admit(1000).unwrap();
        let _second = admissions.admit(1000).unwrap();
        let refused = admissions.admit(1000).err().unwrap();
        assert!(refused.contains("uid 1000 already has 2 open to the test socket"), "{refused}");
        let _other = admissions.admit(1001).unwrap();
        let full = admissions.admit(1002).err().unwrap();
        assert!(full.contains("serving its limit of 3"), "{full}");
        assert!(admissions.admit(0).unwrap().is_none(), "root is admitted without counting");
        drop(first);
        assert!(admissions.admit(1002).unwrap().is_some(), "a closed connection gives its place back");
    }
}
