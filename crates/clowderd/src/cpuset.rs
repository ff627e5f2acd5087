//! Moving host tasks off an enclave's cores with cgroup-v1 cpusets (Pisces offlines the cores
//! instead; under KVM the vCPU threads need them online). The host's tasks go to a
//! `clowder-host` cpuset of the cores no enclave holds, and each enclave's VMM to a
//! `clowder-enclave-<name>` cpuset of its own cores. Tasks the kernel refuses to move (its own
//! per-CPU threads) are counted and reported.
//!
//! Everything is given back: an enclave's cores return to the host when it goes, a clean stop
//! returns every task to the root cpuset and removes the daemon's cpusets, and a daemon that
//! finds cpusets a crashed one left behind does the same before it starts.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::cores::{format_cpu_list, parse_cpu_list};

const V1_ROOT: &str = "/sys/fs/cgroup/cpuset";
/// Names another cpuset to stand for the root: the daemon then treats only the tasks in it as
/// the host (the tests use one, so that they move only their own processes).
pub const ROOT_VARIABLE: &str = "CLOWDER_CPUSET_ROOT";
/// Every cpuset the daemon makes is named with this prefix, and only those are ever removed.
const PREFIX: &str = "clowder-";
const HOST_GROUP: &str = "clowder-host";
const ENCLAVE_PREFIX: &str = "clowder-enclave-";
/// Tasks that fork while they are moved may leave children behind: this many passes.
const MOVE_PASSES: usize = 4;

pub struct Cpusets {
    root: PathBuf,
    /// An exclusive lock on the root directory, held for the daemon's life (it dies with the
    /// process, even on SIGKILL): one daemon isolates cores in a hierarchy, and cpusets found
    /// while taking a free lock were left by a daemon that died.
    _lock: File,
    repairs: Vec<String>,
    /// Set by a clean stop; held while cpusets change, so that an enclave that finishes
    /// booting during the stop makes none again.
    dissolved: Mutex<bool>,
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).map_err(|e| format!("reading {}: {e}", path.display()))
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

impl Cpusets {
    /// Finds a writable cgroup-v1 cpuset hierarchy (or the cpuset `CLOWDER_CPUSET_ROOT`
    /// names), or says why isolation is not possible here.
    pub fn detect() -> Result<Cpusets, String> {
        Cpusets::at(Self::root())
    }

    fn root() -> PathBuf {
        std::env::var_os(ROOT_VARIABLE).map_or_else(|| PathBuf::from(V1_ROOT), PathBuf::from)
    }

    /// For a daemon that does not isolate cores: returns what a killed isolating daemon left in
    /// the hierarchy to the root, unless a live one holds it. Says what was repaired.
    pub fn repair_left_over() -> Vec<String> {
        Cpusets::take(Self::root()).map(|cpusets| cpusets.repairs).unwrap_or_default()
    }

    /// A cpuset hierarchy mounted at `root`. Cpusets of a daemon that died there are repaired
    /// first: see [`Cpusets::repairs`].
    pub fn at(root: PathBuf) -> Result<Cpusets, String> {
        let cpusets = Cpusets::take(root)?;
        // Creating a cpuset is what isolation needs: find out now if it is not allowed.
        let probe = cpusets.root.join(HOST_GROUP);
        std::fs::create_dir(&probe).map_err(|e| format!("cannot create cpusets under {}: {e}", cpusets.root.display()))?;
        std::fs::remove_dir(&probe).map_err(|e| format!("removing {}: {e}", probe.display()))?;
        Ok(cpusets)
    }

    /// Locks the hierarchy at `root` and repairs what a dead daemon left in it.
    fn take(root: PathBuf) -> Result<Cpusets, String> {
        if !root.join("cpuset.cpus").exists() {
            return Err(format!("no cgroup-v1 cpuset hierarchy at {}", root.display()));
        }
        let lock = File::open(&root).map_err(|e| format!("opening {}: {e}", root.display()))?;
        if let Err(e) = lock.try_lock() {
            return Err(format!("another clowderd isolates cores in {} ({e})", root.display()));
        }
        let mut cpusets = Cpusets { root, _lock: lock, repairs: Vec::new(), dissolved: Mutex::new(false) };
        let left = cpusets.give_everything_back()?;
        if !left.is_empty() {
            cpusets.repairs.push(format!("cpusets left by a clowderd that did not stop cleanly: {}", left.join("; ")));
        }
        Ok(cpusets)
    }

    /// What was repaired when the hierarchy was taken over, for the daemon's log.
    pub fn repairs(&self) -> &[String] {
        &self.repairs
    }

    /// The root's cores: everything the host has when no enclave holds any.
    fn all_cores(&self) -> Result<BTreeSet<usize>, String> {
        let cores = parse_cpu_list(&read(&self.root.join("cpuset.cpus"))?);
        Ok(cores.map_err(|e| format!("{}: {e}", self.root.join("cpuset.cpus").display()))?.into_iter().collect())
    }

    /// The root's cores but those of enclaves.
    fn host_cores(&self, enclave_cores: &BTreeSet<usize>) -> Result<BTreeSet<usize>, String> {
        Ok(self.all_cores()?.difference(enclave_cores).copied().collect())
    }

    fn make_group(&self, name: &str, cores: &BTreeSet<usize>) -> Result<PathBuf, String> {
        let group = self.root.join(name);
        if let Err(e) = std::fs::create_dir(&group) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(format!("creating {}: {e}", group.display()));
            }
        }
        // A v1 cpuset takes no tasks until it has memory nodes and cores.
        write(&group.join("cpuset.mems"), &read(&self.root.join("cpuset.mems"))?)?;
        write(&group.join("cpuset.cpus"), &format_cpu_list(cores.iter().copied()))?;
        Ok(group)
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
        let enclave_group = self.make_group(&format!("{ENCLAVE_PREFIX}{enclave}"), &cores.iter().copied().collect())?;
        write(&enclave_group.join("cgroup.procs"), &vmm_pid.to_string())?;
        let host_group = self.make_group(HOST_GROUP, &host_cores)?;
        let (moved, refused) = move_processes(&self.root, &host_group, Some(vmm_pid))?;
        Ok(format!(
            "cpusets: moved {moved} host processes to cores {} ({refused} kernel threads stay), clowder-vmm in {}",
            format_cpu_list(host_cores.iter().copied()),
            enclave_group.display()
        ))
    }

    /// Gives an enclave's cores back to the host once its VMM is gone; `enclave_cores` are the
    /// cores other enclaves still hold. Returns what was done, for the daemon's log.
    pub fn release(&self, enclave: &str, enclave_cores: &BTreeSet<usize>) -> Result<String, String> {
        let host_cores = format_cpu_list(self.host_cores(enclave_cores)?);
        let host_group = self.root.join(HOST_GROUP);
        let enclave_group = self.root.join(format!("{ENCLAVE_PREFIX}{enclave}"));
        if !enclave_group.exists() {
            return Ok(format!("cpusets: enclave {enclave} had none"));
        }
        // Widening the host's cpuset widens the affinity of every task in it at once.
        if host_group.exists() {
            write(&host_group.join("cpuset.cpus"), &host_cores)?;
        }
        // Anything left (a VMM that outlived its enclave) returns to the host first.
        let destination = if host_group.exists() { &host_group } else { &self.root };
        move_processes(&enclave_group, destination, None)?;
        std::fs::remove_dir(&enclave_group).map_err(|e| format!("removing {}: {e}", enclave_group.display()))?;
        Ok(format!("cpusets: enclave {enclave}'s cores returned to the host, which has cores {host_cores}; removed {}", enclave_group.display()))
    }

    /// Returns every task in the daemon's cpusets to the root and removes them (the daemon is
    /// stopping). Returns what was done, for the daemon's log.
    pub fn dissolve(&self) -> Result<String, String> {
        let mut dissolved = self.dissolved.lock().unwrap();
        *dissolved = true;
        let done = self.give_everything_back()?;
        Ok(if done.is_empty() { "cpusets: none to remove".into() } else { format!("cpusets: {}", done.join("; ")) })
    }

    /// Moves the tasks of every `clowder-*` cpuset back to the root and removes the cpusets;
    /// says, per cpuset, what it held.
    fn give_everything_back(&self) -> Result<Vec<String>, String> {
        let entries = std::fs::read_dir(&self.root).map_err(|e| format!("reading {}: {e}", self.root.display()))?;
        let mut groups: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with(PREFIX) && entry.path().is_dir())
            .map(|entry| entry.path())
            .collect();
        groups.sort();
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
                "{name} (cores {}): {moved} processes back to the root cpuset{refused}, {removed}",
                if cores.is_empty() { "none" } else { &cores }
            ));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory standing in for cgroupfs: its control files are plain files here.
    fn fake_hierarchy(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("clowder-cpuset-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(root.join("cpuset.mems"), "0\n").unwrap();
        std::fs::write(root.join("cgroup.procs"), "1\n77\n300\n").unwrap();
        root
    }

    #[test]
    fn isolation_moves_host_processes_and_confines_the_vmm() {
        let root = fake_hierarchy("isolate");
        let cpusets = Cpusets::at(root.clone()).unwrap();
        assert!(cpusets.repairs().is_empty());
        assert!(!root.join(HOST_GROUP).exists(), "the probe leaves nothing behind");
        let done = cpusets.isolate("sim", &[2, 3], &[2, 3].into(), 77).unwrap();
        assert!(done.contains("moved 2 host processes to cores 0-1"), "{done}");
        assert_eq!(read(&root.join("clowder-enclave-sim/cpuset.cpus")).unwrap(), "2-3");
        assert_eq!(read(&root.join("clowder-enclave-sim/cpuset.mems")).unwrap(), "0");
        assert_eq!(read(&root.join("clowder-enclave-sim/cgroup.procs")).unwrap(), "77");
        assert_eq!(read(&root.join("clowder-host/cpuset.cpus")).unwrap(), "0-1");
        assert!(cpusets.isolate("x", &[0], &[0, 1, 2, 3].into(), 5).unwrap_err().contains("no cores"));
        assert!(Cpusets::at(root.join("missing")).is_err());
        // After a clean stop, an enclave that just finished booting makes no cpusets again.
        cpusets.dissolve().unwrap();
        assert!(cpusets.isolate("late", &[3], &[3].into(), 99).unwrap_err().contains("stopping"));
        assert!(!root.join("clowder-enclave-late").exists());
        drop(cpusets);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The host's cores are the root's but the enclaves', whatever the daemon's own affinity
    /// is (it is confined with the host while an enclave exists).
    #[test]
    fn release_gives_the_cores_back_to_the_host() {
        let root = fake_hierarchy("release");
        let cpusets = Cpusets::at(root.clone()).unwrap();
        cpusets.isolate("a", &[3], &[3].into(), 77).unwrap();
        cpusets.isolate("b", &[2], &[2, 3].into(), 78).unwrap();
        assert_eq!(read(&root.join("clowder-host/cpuset.cpus")).unwrap(), "0-1");
        // A plain directory with files in it cannot be removed: the release still widened the host.
        let error = cpusets.release("a", &[2].into()).unwrap_err();
        assert!(error.contains("removing"), "{error}");
        assert_eq!(read(&root.join("clowder-host/cpuset.cpus")).unwrap(), "0-1,3");
        assert!(cpusets.release("nothing", &[2].into()).unwrap().contains("had none"));
        drop(cpusets);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn one_daemon_per_hierarchy() {
        let root = fake_hierarchy("lock");
        let first = Cpusets::at(root.clone()).unwrap();
        let error = Cpusets::at(root.clone()).err().unwrap();
        assert!(error.contains("another clowderd isolates cores"), "{error}");
        drop(first);
        assert!(Cpusets::at(root.clone()).is_ok(), "the lock goes with its holder");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
