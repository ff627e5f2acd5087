//! cgroup v2: each enclave's cores become a cpuset partition, `clowder-enclave-<name>` with
//! `cpuset.cpus.partition` = `isolated` (or `root` on a kernel without isolated partitions).
//! Tasks cannot be moved between cpusets one by one as on v1, and need not be: a partition's
//! cores leave its parent's `cpuset.cpus.effective`, and so the effective cores of every other
//! cgroup below the root; the kernel narrows the affinity of all the host's tasks, in whatever
//! cgroup they are, at once (an isolated partition also drops the cores from the scheduler's
//! load balancing and unbound workqueues). Removing the partition gives the cores back the same
//! way. The kernel's own per-CPU threads stay, as on v1.

use std::collections::BTreeSet;
use std::path::Path;

use super::{read, read_cores, write};
use crate::cores::format_cpu_list;

/// Says why the cgroup2 hierarchy at `root` cannot hold cpuset partitions, if it cannot.
pub(super) fn offers_cpuset(root: &Path) -> Result<(), String> {
    let controllers = read(&root.join("cgroup.controllers")).map_err(|e| format!("no cgroup-v2 hierarchy at {}: {e}", root.display()))?;
    if controllers.split_whitespace().any(|controller| controller == "cpuset") {
        return Ok(());
    }
    let offered = if controllers.is_empty() { "none" } else { &controllers };
    Err(format!(
        "the cgroup2 at {} has no cpuset controller (it offers: {offered}; a kernel binds cpuset to a cgroup-v1 hierarchy when one mounts it)",
        root.display()
    ))
}

/// Lets the root's children have cpusets (cpuset is a threaded controller: the root may keep
/// processes of its own meanwhile).
pub(super) fn enable_cpuset(root: &Path) -> Result<(), String> {
    let enabled = read(&root.join("cgroup.subtree_control"))?;
    if enabled.split_whitespace().any(|controller| controller.trim_start_matches('+') == "cpuset") {
        return Ok(());
    }
    write(&root.join("cgroup.subtree_control"), "+cpuset")
}

/// The root's effective cores: partitions made by the daemon are already out of them, so only
/// `host_cores`' difference with every enclave's cores is meaningful.
pub(super) fn all_cores(root: &Path) -> Result<BTreeSet<usize>, String> {
    read_cores(&root.join("cpuset.cpus.effective"))
}

/// What `cpuset.cpus.partition` says: its type when valid, or why the kernel found it invalid
/// (`isolated invalid (Cpu list in cpuset.cpus not exclusive)`).
fn partition_state(state: &str) -> Result<&str, String> {
    if !state.contains("invalid") {
        return Ok(state);
    }
    let reason = state.split_once('(').map_or(state, |(_, reason)| reason.trim_end_matches(')'));
    Err(format!("the kernel made the cpuset partition invalid: {reason}"))
}

/// Makes `group` a partition of `cores`, isolated where the kernel can, and says which.
fn make_partition(group: &Path, cores: &BTreeSet<usize>) -> Result<String, String> {
    if let Err(e) = std::fs::create_dir(group) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(format!("creating {}: {e}", group.display()));
        }
    }
    write(&group.join("cpuset.cpus"), &format_cpu_list(cores.iter().copied()))?;
    let partition = group.join("cpuset.cpus.partition");
    // Kernels before 5.15 know only `root` partitions.
    if let Err(isolated) = write(&partition, "isolated") {
        write(&partition, "root").map_err(|root| format!("{isolated}, and {root}"))?;
    }
    let state = read(&partition)?;
    partition_state(&state).map(str::to_string).map_err(|why| format!("{}: {why}", group.display()))
}

/// Gives `cores` to a partition `enclave_group` below `root` and moves the VMM into it.
pub(super) fn isolate(root: &Path, enclave_group: &Path, cores: &BTreeSet<usize>, vmm_pid: u32) -> Result<String, String> {
    let made = make_partition(enclave_group, cores).and_then(|state| {
        write(&enclave_group.join("cgroup.procs"), &vmm_pid.to_string())?;
        Ok(state)
    });
    let state = match made {
        Ok(state) => state,
        Err(why) => {
            // Nothing was moved into it: an empty cgroup is removed, whatever its state.
            let _ = std::fs::remove_dir(enclave_group);
            return Err(why);
        }
    };
    Ok(format!(
        "cpusets: {state} partition {} on cores {}, clowder-vmm in it; every other cgroup keeps cores {}",
        enclave_group.display(),
        format_cpu_list(cores.iter().copied()),
        read(&root.join("cpuset.cpus.effective"))?
    ))
}

#[cfg(test)]
mod tests {
    //! Against a directory that mimics a cgroup2 root: this machine's kernel binds cpuset to
    //! its v1 hierarchy. tests/cpuset_v2_live.rs moves the controller to the real cgroup2
    //! mount where the machine allows it, and tests/cpuset_v2.rs runs a daemon on both.
    use super::super::tests::{fake_tree, TempDir};
    use super::super::{Cpusets, Version};
    use super::*;

    fn fake_hierarchy(name: &str, controllers: &str) -> TempDir {
        fake_tree(
            &format!("cgroup2-{name}"),
            &[
                ("cgroup.controllers", controllers),
                ("cgroup.subtree_control", "\n"),
                ("cpuset.cpus.effective", "0-3\n"),
                ("cgroup.procs", "1\n77\n300\n"),
            ],
        )
    }

    #[test]
    fn an_enclave_gets_an_isolated_partition_and_host_tasks_stay_in_their_cgroups() {
        let root = fake_hierarchy("isolate", "cpuset cpu io memory pids\n");
        let cpusets = Cpusets::at(root.0.clone(), Version::V2).unwrap();
        assert_eq!(read(&root.0.join("cgroup.subtree_control")).unwrap(), "+cpuset");
        let done = cpusets.isolate("sim", &[2, 3], &[2, 3].into(), 77).unwrap();
        assert!(done.contains("isolated partition") && done.contains("on cores 2-3"), "{done}");
        assert_eq!(read(&root.0.join("clowder-enclave-sim/cpuset.cpus")).unwrap(), "2-3");
        assert_eq!(read(&root.0.join("clowder-enclave-sim/cpuset.cpus.partition")).unwrap(), "isolated");
        assert_eq!(read(&root.0.join("clowder-enclave-sim/cgroup.procs")).unwrap(), "77");
        // No v1-style host group, and no host task written anywhere.
        assert!(!root.0.join("clowder-host").exists());
        assert_eq!(read(&root.0.join("cgroup.procs")).unwrap(), "1\n77\n300");
        assert!(cpusets.isolate("x", &[0], &[0, 1, 2, 3].into(), 5).unwrap_err().contains("no cores"));
        // A plain directory with files in it cannot be removed (a cgroup can): the VMM was
        // still returned to the root.
        std::fs::write(root.0.join("cgroup.procs"), "").unwrap();
        let error = cpusets.release("sim", &BTreeSet::new()).unwrap_err();
        assert!(error.contains("removing"), "{error}");
        assert_eq!(read(&root.0.join("cgroup.procs")).unwrap(), "77");
        cpusets.dissolve().unwrap();
        assert!(cpusets.isolate("late", &[3], &[3].into(), 99).unwrap_err().contains("stopping"));
    }

    #[test]
    fn a_partition_left_by_a_dead_daemon_is_repaired_and_reported() {
        let root = fake_hierarchy("repair", "cpuset\n");
        let left = root.0.join("clowder-enclave-old");
        std::fs::create_dir(&left).unwrap();
        std::fs::write(left.join("cpuset.cpus"), "3\n").unwrap();
        std::fs::write(left.join("cgroup.procs"), "55\n").unwrap();
        let cpusets = Cpusets::at(root.0.clone(), Version::V2).unwrap();
        let repairs = cpusets.repairs().join("\n");
        assert!(repairs.contains("clowder-enclave-old (cores 3): 1 processes back to the root cgroup"), "{repairs}");
        assert_eq!(read(&root.0.join("cgroup.procs")).unwrap(), "55");
    }

    #[test]
    fn a_cgroup2_without_cpuset_is_refused_in_one_line_naming_what_is_missing() {
        let root = fake_hierarchy("nocpuset", "hugetlb\n");
        let error = Cpusets::at(root.0.clone(), Version::V2).err().unwrap();
        assert!(error.contains("has no cpuset controller (it offers: hugetlb;"), "{error}");
        assert!(!error.contains('\n'));
    }

    #[test]
    fn an_invalid_partition_is_refused_with_the_kernels_reason() {
        assert_eq!(partition_state("isolated"), Ok("isolated"));
        assert_eq!(partition_state("root"), Ok("root"));
        let error = partition_state("isolated invalid (Cpu list in cpuset.cpus not exclusive)").unwrap_err();
        assert_eq!(error, "the kernel made the cpuset partition invalid: Cpu list in cpuset.cpus not exclusive");
        assert!(partition_state("root invalid").unwrap_err().ends_with("invalid: root invalid"));
    }
}
