//! Moving host tasks off an enclave's cores with cpusets (Pisces offlines the cores instead;
//! under KVM the vCPU threads need them online), on cgroup v1 ([`v1`]) or cgroup v2 ([`v2`]),
//! whichever holds the cpuset controller (a kernel binds it to one of them). Each enclave's
//! VMM goes to a `clowder-enclave-<name>` cgroup of its own cores; how the host leaves those
//! cores differs per version (see each module).
//!
//! Everything is given back: an enclave's cores return to the host when it goes, a clean stop
//! returns every task to the root and removes the daemon's cgroups, and a daemon that finds
//! cgroups a crashed one left behind does the same before it starts.

mod v1;
mod v2;

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::cores::parse_cpu_list;

const V1_ROOT: &str = "/sys/fs/cgroup/cpuset";
/// Names another cgroup to stand for the root: the daemon then treats only the tasks in it as
/// the host (the tests use one, so that they move only their own processes). A directory with
/// `cgroup.controllers` is taken as cgroup v2, one with `cpuset.cpus` alone as v1.
pub const ROOT_VARIABLE: &str = "CLOWDER_CPUSET_ROOT";
/// Every cgroup the daemon makes is named with this prefix, and only those are ever removed.
const PREFIX: &str = "clowder-";
const ENCLAVE_PREFIX: &str = "clowder-enclave-";
/// Tasks that fork while they are moved may leave children behind: this many passes.
const MOVE_PASSES: usize = 4;

/// Which cgroup version the hierarchy at the root is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

pub struct Cpusets {
    root: PathBuf,
    version: Version,
    /// An exclusive lock on the root directory, held for the daemon's life (it dies with the
    /// process, even on SIGKILL): one daemon isolates cores in a hierarchy, and cgroups found
    /// while taking a free lock were left by a daemon that died.
    _lock: File,
    repairs: Vec<String>,
    /// Set by a clean stop; held while cgroups change, so that an enclave that finishes
    /// booting during the stop makes none again.
    dissolved: Mutex<bool>,
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn read_cores(path: &Path) -> Result<BTreeSet<usize>, String> {
    Ok(parse_cpu_list(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))?.into_iter().collect())
}

/// Moves every process of `from` into `to` (but `except`); returns (moved, refused).
fn move_processes(from: &Path, to: &Path, except: Option<u32>) -> Result<(usize, usize), String> {
    let (mut moved, mut refused) = (0, 0);
    let mut tried = BTreeSet::new();
    for _ in 0..MOVE_PASSES {
        let pids: Vec<String> = read(&from.join("cgroup.procs"))?
            .lines()
            .filter(|pid| except.is_none_or(|except| *pid != except.to_string()) && !tried.contains(*pid))
            .map(str::to_string)
            .collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            match std::fs::write(to.join("cgroup.procs"), &pid) {
                Ok(()) => moved += 1,
                // A process that ended meanwhile is not a refusal.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(_) => refused += 1,
            }
            tried.insert(pid);
        }
    }
    Ok((moved, refused))
}

/// The cgroup version of the hierarchy whose root (or stand-in) is `root`, if it is one.
fn version_at(root: &Path) -> Option<Version> {
    if root.join("cgroup.controllers").exists() {
        Some(Version::V2)
    } else if root.join("cpuset.cpus").exists() {
        Some(Version::V1)
    } else {
        None
    }
}

/// Where the cgroup2 hierarchy is mounted, from a mount table in /proc/mounts's format.
fn cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    mounts
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.get(2) == Some(&"cgroup2"))
        .map(|fields| PathBuf::from(fields[1]))
}

/// The hierarchy to isolate cores in: `CLOWDER_CPUSET_ROOT` if set, else the v1 cpuset mount,
/// else the cgroup2 mount if its root offers the cpuset controller. Otherwise one line saying
/// what is missing.
fn locate() -> Result<(PathBuf, Version), String> {
    if let Some(root) = std::env::var_os(ROOT_VARIABLE).map(PathBuf::from) {
        return match version_at(&root) {
            Some(version) => Ok((root, version)),
            None => Err(format!("{ROOT_VARIABLE}={} is neither a cgroup-v2 cgroup nor a cgroup-v1 cpuset", root.display())),
        };
    }
    if Path::new(V1_ROOT).join("cpuset.cpus").exists() {
        return Ok((PathBuf::from(V1_ROOT), Version::V1));
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    match cgroup2_mount(&mounts) {
        None => Err(format!("no cgroup-v1 cpuset hierarchy at {V1_ROOT} and no cgroup2 mount")),
        Some(root) => v2::offers_cpuset(&root)
            .map(|()| (root, Version::V2))
            .map_err(|why| format!("no cgroup-v1 cpuset hierarchy at {V1_ROOT}, and {why}")),
    }
}

impl Cpusets {
    /// Finds a writable cpuset hierarchy, v1 or v2 (or the cgroup `CLOWDER_CPUSET_ROOT`
    /// names), or says in one line why isolation is not possible here.
    pub fn detect() -> Result<Cpusets, String> {
        let (root, version) = locate()?;
        Cpusets::at(root, version)
    }

    /// For a daemon that does not isolate cores: returns what a killed isolating daemon left in
    /// the hierarchy to the root, unless a live one holds it. Says what was repaired.
    pub fn repair_left_over() -> Vec<String> {
        locate().and_then(|(root, version)| Cpusets::take(root, version)).map(|cpusets| cpusets.repairs).unwrap_or_default()
    }

    /// A cpuset hierarchy of `version` rooted at `root`. Cgroups of a daemon that died there
    /// are repaired first: see [`Cpusets::repairs`].
    pub fn at(root: PathBuf, version: Version) -> Result<Cpusets, String> {
        if version == Version::V2 {
            v2::offers_cpuset(&root)?;
        }
        let cpusets = Cpusets::take(root, version)?;
        if version == Version::V2 {
            v2::enable_cpuset(&cpusets.root)?;
        }
        // Creating a cgroup is what isolation needs: find out now if it is not allowed.
        let probe = cpusets.root.join(format!("{PREFIX}probe"));
        std::fs::create_dir(&probe).map_err(|e| format!("cannot create cgroups under {}: {e}", cpusets.root.display()))?;
        std::fs::remove_dir(&probe).map_err(|e| format!("removing {}: {e}", probe.display()))?;
        Ok(cpusets)
    }

    /// Locks the hierarchy at `root` and repairs what a dead daemon left in it.
    fn take(root: PathBuf, version: Version) -> Result<Cpusets, String> {
        if version_at(&root) != Some(version) {
            let what = if version == Version::V1 { "cgroup-v1 cpuset hierarchy" } else { "cgroup-v2 hierarchy" };
            return Err(format!("no {what} at {}", root.display()));
        }
        let lock = File::open(&root).map_err(|e| format!("opening {}: {e}", root.display()))?;
        if let Err(e) = lock.try_lock() {
            return Err(format!("another clowderd isolates cores in {} ({e})", root.display()));
        }
        let mut cpusets = Cpusets { root, version, _lock: lock, repairs: Vec::new(), dissolved: Mutex::new(false) };
        let left = cpusets.give_everything_back()?;
        if !left.is_empty() {
            cpusets.repairs.push(format!("cpusets left by a clowderd that did not stop cleanly: {}", left.join("; ")));
        }
        Ok(cpusets)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// What was repaired when the hierarchy was taken over, for the daemon's log.
    pub fn repairs(&self) -> &[String] {
        &self.repairs
    }

    /// The root's cores: everything the host has when no enclave holds any.
    fn all_cores(&self) -> Result<BTreeSet<usize>, String> {
        match self.version {
            Version::V1 => read_cores(&self.root.join("cpuset.cpus")),
            Version::V2 => v2::all_cores(&self.root),
        }
    }

    /// The root's cores but those of enclaves.
    fn host_cores(&self, enclave_cores: &BTreeSet<usize>) -> Result<BTreeSet<usize>, String> {
        Ok(self.all_cores()?.difference(enclave_cores).copied().collect())
    }

    fn enclave_group(&self, enclave: &str) -> PathBuf {
        self.root.join(format!("{ENCLAVE_PREFIX}{enclave}"))
    }

    /// Gives `cores` to the enclave whose VMM is `vmm_pid`; the host keeps the root's cores but
    /// `enclave_cores` (every enclave's, this one's included). Returns what was done, for the user.
    pub fn isolate(&self, enclave: &str, cores: &[usize], enclave_cores: &BTreeSet<usize>, vmm_pid: u32) -> Result<String, String> {
        let dissolved = self.dissolved.lock().unwrap();
        if *dissolved {
            return Err("clowderd is stopping".into());
        }
        let host_cores = self.host_cores(enclave_cores)?;
        if host_cores.is_empty() {
            return Err("the host would keep no cores".into());
        }
        let cores = cores.iter().copied().collect();
        match self.version {
            Version::V1 => v1::isolate(&self.root, &self.enclave_group(enclave), &cores, &host_cores, vmm_pid),
            Version::V2 => v2::isolate(&self.root, &self.enclave_group(enclave), &cores, vmm_pid),
        }
    }

    /// Gives an enclave's cores back to the host once its VMM is gone; `enclave_cores` are the
    /// cores other enclaves still hold. Returns what was done, for the daemon's log.
    pub fn release(&self, enclave: &str, enclave_cores: &BTreeSet<usize>) -> Result<String, String> {
        let enclave_group = self.enclave_group(enclave);
        if !enclave_group.exists() {
            return Ok(format!("cpusets: enclave {enclave} had none"));
        }
        let host_cores = match self.version {
            Version::V1 => Some(v1::widen_host(&self.root, &self.host_cores(enclave_cores)?)?),
            Version::V2 => None,
        };
        // Anything left (a VMM that outlived its enclave) returns to the host first.
        let host_group = self.root.join(v1::HOST_GROUP);
        let destination = if host_group.exists() { &host_group } else { &self.root };
        move_processes(&enclave_group, destination, None)?;
        // A v2 partition's cores go back to its parent, and so to the host, when it is removed.
        std::fs::remove_dir(&enclave_group).map_err(|e| format!("removing {}: {e}", enclave_group.display()))?;
        let host_cores = match host_cores {
            Some(cores) => cores,
            None => read(&self.root.join("cpuset.cpus.effective"))?,
        };
        Ok(format!(
            "cpusets: enclave {enclave}'s cores returned to the host, which has cores {host_cores}; removed {}",
            enclave_group.display()
        ))
    }

    /// Returns every task in the daemon's cgroups to the root and removes them (the daemon is
    /// stopping). Returns what was done, for the daemon's log.
    pub fn dissolve(&self) -> Result<String, String> {
        let mut dissolved = self.dissolved.lock().unwrap();
        *dissolved = true;
        let done = self.give_everything_back()?;
        Ok(if done.is_empty() { "cpusets: none to remove".into() } else { format!("cpusets: {}", done.join("; ")) })
    }

    /// Moves the tasks of every `clowder-*` cgroup back to the root and removes the cgroups;
    /// says, per cgroup, what it held.
    fn give_everything_back(&self) -> Result<Vec<String>, String> {
        let entries = std::fs::read_dir(&self.root).map_err(|e| format!("reading {}: {e}", self.root.display()))?;
        let mut groups: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with(PREFIX) && entry.path().is_dir())
            .map(|entry| entry.path())
            .collect();
        groups.sort();
        let root_name = match self.version {
            Version::V1 => "root cpuset",
            Version::V2 => "root cgroup",
        };
        let mut done = Vec::new();
        for group in groups {
            let name = group.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let cores = read(&group.join("cpuset.cpus")).unwrap_or_default();
            let (moved, refused) = move_processes(&group, &self.root, None)?;
            let removed = match std::fs::remove_dir(&group) {
                Ok(()) => "removed".to_string(),
                Err(e) => format!("NOT removed ({e})"),
            };
            let refused = if refused > 0 { format!(", {refused} refused to move") } else { String::new() };
            done.push(format!(
                "{name} (cores {}): {moved} processes back to the {root_name}{refused}, {removed}",
                if cores.is_empty() { "none" } else { &cores }
            ));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    pub(super) use clowder_test_support::TempDir;

    use super::*;

    /// A fresh directory standing in for a cgroup root (`clowder-{name}-PID` in the temporary
    /// directory), its control files plain files with these contents.
    pub(super) fn fake_tree(name: &str, files: &[(&str, &str)]) -> TempDir {
        let root = TempDir::new(&format!("clowder-{name}"));
        for (file, contents) in files {
            std::fs::write(root.0.join(file), contents).unwrap();
        }
        root
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_the_mount_table() {
        let hybrid = "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        assert_eq!(cgroup2_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0"), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn a_directory_that_is_no_cgroup_is_refused() {
        let error = Cpusets::at(std::env::temp_dir().join("clowder-no-such-cgroup"), Version::V2).err().unwrap();
        assert!(error.contains("clowder-no-such-cgroup"), "{error}");
        let error = Cpusets::at(std::env::temp_dir(), Version::V1).err().unwrap();
        assert!(error.starts_with("no cgroup-v1 cpuset hierarchy at"), "{error}");
    }
}
