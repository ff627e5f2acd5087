//! cgroup v1: the host's tasks are moved, one by one, to a `clowder-host` cpuset of the cores no
//! enclave holds (a v1 cpuset is per task: nothing else keeps them off). Tasks the kernel
//! refuses to move (its own per-CPU threads) are counted and reported.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{move_processes, read, write};
use crate::cores::format_cpu_list;

pub(super) const HOST_GROUP: &str = "clowder-host";

fn make_group(root: &Path, group: &Path, cores: &BTreeSet<usize>) -> Result<(), String> {
    if let Err(e) = std::fs::create_dir(group) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(format!("creating {}: {e}", group.display()));
        }
    }
    // A v1 cpuset takes no tasks until it has memory nodes and cores.
    write(&group.join("cpuset.mems"), &read(&root.join("cpuset.mems"))?)?;
    write(&group.join("cpuset.cpus"), &format_cpu_list(cores.iter().copied()))
}

/// Confines the VMM to `enclave_group` on `cores`, and every other task of the root to
/// `clowder-host` on `host_cores`.
pub(super) fn isolate(
    root: &Path,
    enclave_group: &Path,
    cores: &BTreeSet<usize>,
    host_cores: &BTreeSet<usize>,
    vmm_pid: u32,
) -> Result<String, String> {
    make_group(root, enclave_group, cores)?;
    write(&enclave_group.join("cgroup.procs"), &vmm_pid.to_string())?;
    let host_group: PathBuf = root.join(HOST_GROUP);
    make_group(root, &host_group, host_cores)?;
    let (moved, refused) = move_processes(root, &host_group, Some(vmm_pid))?;
    Ok(format!(
        "cpusets: moved {moved} host processes to cores {} ({refused} kernel threads stay), clowder-vmm in {}",
        format_cpu_list(host_cores.iter().copied()),
        enclave_group.display()
    ))
}

/// Gives `clowder-host` the cores `host_cores` (widening a v1 cpuset widens the affinity of
/// every task in it at once); returns them as a list, for the log.
pub(super) fn widen_host(root: &Path, host_cores: &BTreeSet<usize>) -> Result<String, String> {
    let host_cores = format_cpu_list(host_cores.iter().copied());
    let host_group = root.join(HOST_GROUP);
    if host_group.exists() {
        write(&host_group.join("cpuset.cpus"), &host_cores)?;
    }
    Ok(host_cores)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fake_tree, TempDir};
    use super::super::{Cpusets, Version};
    use super::*;

    /// A directory standing in for cgroupfs: its control files are plain files here.
    fn fake_hierarchy(name: &str) -> TempDir {
        fake_tree(&format!("cpuset-{name}"), &[("cpuset.cpus", "0-3\n"), ("cpuset.mems", "0\n"), ("cgroup.procs", "1\n77\n300\n")])
    }

    #[test]
    fn isolation_moves_host_processes_and_confines_the_vmm() {
        let root = fake_hierarchy("isolate");
        let cpusets = Cpusets::at(root.0.clone(), Version::V1).unwrap();
        assert!(cpusets.repairs().is_empty());
        assert!(!root.0.join("clowder-probe").exists(), "the probe leaves nothing behind");
        let done = cpusets.isolate("sim", &[2, 3], &[2, 3].into(), 77).unwrap();
        assert!(done.contains("moved 2 host processes to cores 0-1"), "{done}");
        assert_eq!(read(&root.0.join("clowder-enclave-sim/cpuset.cpus")).unwrap(), "2-3");
        assert_eq!(read(&root.0.join("clowder-enclave-sim/cpuset.mems")).unwrap(), "0");
        assert_eq!(read(&root.0.join("clowder-enclave-sim/cgroup.procs")).unwrap(), "77");
        assert_eq!(read(&root.0.join("clowder-host/cpuset.cpus")).unwrap(), "0-1");
        assert!(cpusets.isolate("x", &[0], &[0, 1, 2, 3].into(), 5).unwrap_err().contains("no cores"));
        assert!(Cpusets::at(root.0.join("missing"), Version::V1).is_err());
        // After a clean stop, an enclave that just finished booting makes no cpusets again.
        cpusets.dissolve().unwrap();
        assert!(cpusets.isolate("late", &[3], &[3].into(), 99).unwrap_err().contains("stopping"));
        assert!(!root.0.join("clowder-enclave-late").exists());
    }

    /// The host's cores are the root's but the enclaves', whatever the daemon's own affinity
    /// is (it is confined with the host while an enclave exists).
    #[test]
    fn release_gives_the_cores_back_to_the_host() {
        let root = fake_hierarchy("release");
        let cpusets = Cpusets::at(root.0.clone(), Version::V1).unwrap();
        cpusets.isolate("a", &[3], &[3].into(), 77).unwrap();
        cpusets.isolate("b", &[2], &[2, 3].into(), 78).unwrap();
        assert_eq!(read(&root.0.join("clowder-host/cpuset.cpus")).unwrap(), "0-1");
        // A plain directory with files in it cannot be removed: the release still widened the host.
        let error = cpusets.release("a", &[2].into()).unwrap_err();
        assert!(error.contains("removing"), "{error}");
        assert_eq!(read(&root.0.join("clowder-host/cpuset.cpus")).unwrap(), "0-1,3");
        assert!(cpusets.release("nothing", &[2].into()).unwrap().contains("had none"));
    }

    #[test]
    fn one_daemon_per_hierarchy() {
        let root = fake_hierarchy("lock");
        let first = Cpusets::at(root.0.clone(), Version::V1).unwrap();
        let error = Cpusets::at(root.0.clone(), Version::V1).err().unwrap();
        assert!(error.contains("another clowderd isolates cores"), "{error}");
        drop(first);
        assert!(Cpusets::at(root.0.clone(), Version::V1).is_ok(), "the lock goes with its holder");
    }
}
