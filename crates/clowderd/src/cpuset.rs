//! Moving host tasks off an enclave's cores with cgroup-v1 cpusets (Pisces offlines the cores
//! instead; under KVM the vCPU threads need them online). The host's tasks go to a
//! `clowder-host` cpuset that leaves out every enclave's cores, and each enclave's VMM to a
//! `clowder-<name>` cpuset of its own cores. Tasks the kernel refuses to move (its own
//! per-CPU threads) are counted and reported.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::cores::format_cpu_list;

const V1_ROOT: &str = "/sys/fs/cgroup/cpuset";
const HOST_GROUP: &str = "clowder-host";

pub struct Cpusets {
    root: PathBuf,
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).map_err(|e| format!("reading {}: {e}", path.display()))
}

impl Cpusets {
    /// Finds a writable cgroup-v1 cpuset hierarchy, or says why isolation is not possible here.
    pub fn detect() -> Result<Cpusets, String> {
        Cpusets::at(PathBuf::from(V1_ROOT))
    }

    /// A cpuset hierarchy mounted at `root`.
    pub fn at(root: PathBuf) -> Result<Cpusets, String> {
        if !root.join("cpuset.cpus").exists() {
            return Err(format!("no cgroup-v1 cpuset hierarchy at {}", root.display()));
        }
        let probe = root.join(HOST_GROUP);
        if let Err(e) = std::fs::create_dir(&probe) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(format!("cannot create cpusets under {}: {e}", root.display()));
            }
        }
        Ok(Cpusets { root })
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

    /// Moves every process of `from` into `to`; returns (moved, refused).
    fn move_processes(from: &Path, to: &Path, except: Option<u32>) -> Result<(usize, usize), String> {
        let (mut moved, mut refused) = (0, 0);
        for pid in read(&from.join("cgroup.procs"))?.lines() {
            if except.is_some_and(|except| pid == except.to_string()) {
                continue;
            }
            match std::fs::write(to.join("cgroup.procs"), pid) {
                Ok(()) => moved += 1,
                Err(_) => refused += 1,
            }
        }
        Ok((moved, refused))
    }

    /// Gives `cores` to the enclave whose VMM is `vmm_pid`; the host keeps `host_cores`.
    /// Returns what was done, for the user.
    pub fn isolate(&self, enclave: &str, cores: &[usize], host_cores: &BTreeSet<usize>, vmm_pid: u32) -> Result<String, String> {
        if host_cores.is_empty() {
            return Err("the host would keep no cores".into());
        }
        let enclave_group = self.make_group(&format!("clowder-{enclave}"), &cores.iter().copied().collect())?;
        write(&enclave_group.join("cgroup.procs"), &vmm_pid.to_string())?;
        let host_group = self.make_group(HOST_GROUP, host_cores)?;
        let (moved, refused) = Self::move_processes(&self.root, &host_group, Some(vmm_pid))?;
        Ok(format!(
            "cpusets: moved {moved} host processes to cores {} ({refused} kernel threads stay), clowder-vmm in {}",
            format_cpu_list(host_cores.iter().copied()),
            enclave_group.display()
        ))
    }

    /// Gives an enclave's cores back to the host once its VMM is gone.
    pub fn release(&self, enclave: &str, host_cores: &BTreeSet<usize>) -> Result<(), String> {
        let host_group = self.root.join(HOST_GROUP);
        write(&host_group.join("cpuset.cpus"), &format_cpu_list(host_cores.iter().copied()))?;
        let enclave_group = self.root.join(format!("clowder-{enclave}"));
        // Anything left (a VMM that outlived its enclave) returns to the host group first.
        if enclave_group.exists() {
            Self::move_processes(&enclave_group, &host_group, None)?;
            std::fs::remove_dir(&enclave_group).map_err(|e| format!("removing {}: {e}", enclave_group.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory standing in for cgroupfs: its control files are plain files here.
    #[test]
    fn isolation_moves_host_processes_and_confines_the_vmm() {
        let root = std::env::temp_dir().join(format!("clowder-cpuset-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(root.join("cpuset.mems"), "0\n").unwrap();
        std::fs::write(root.join("cgroup.procs"), "1\n77\n300\n").unwrap();
        let cpusets = Cpusets::at(root.clone()).unwrap();
        let done = cpusets.isolate("sim", &[2, 3], &[0, 1].into(), 77).unwrap();
        assert!(done.contains("moved 2 host processes to cores 0-1"), "{done}");
        assert_eq!(read(&root.join("clowder-sim/cpuset.cpus")).unwrap(), "2-3");
        assert_eq!(read(&root.join("clowder-sim/cpuset.mems")).unwrap(), "0");
        assert_eq!(read(&root.join("clowder-sim/cgroup.procs")).unwrap(), "77");
        assert_eq!(read(&root.join("clowder-host/cpuset.cpus")).unwrap(), "0-1");
        assert!(cpusets.isolate("x", &[0], &BTreeSet::new(), 5).unwrap_err().contains("no cores"));
        assert!(Cpusets::at(root.join("missing")).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
