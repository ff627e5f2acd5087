//! `clowderd --isolate-cores` on cgroup v2. This machine's kernel binds the cpuset controller
//! to its cgroup-v1 hierarchy (a hybrid: the cgroup2 mount offers no cpuset), so no v2 cpuset
//! partition can be made live here. What runs live: the daemon pointed at the machine's real
//! cgroup2 mount says, in one line, that it has no cpuset controller. What runs against a
//! directory that mimics a cgroup2 root (its control files are plain files, so nothing is
//! enforced and a directory with files cannot be removed): a real enclave's VMM goes into an
//! isolated partition of its core, host tasks are left where they are, and removal, a clean
//! stop and a restart give back and report what the daemon made.

#[path = "support/cpuset_daemon.rs"]
mod cpuset_daemon;

use std::path::{Path, PathBuf};

use clowder_test_support::{cpuset_lock, skipped, vmm_binary, why_enclaves_cannot_boot, TempDir};
use cpuset_daemon::{read, Daemon};
use serde_json::json;

#[test]
fn the_machines_cgroup2_without_cpuset_is_refused_in_one_line() {
    // cpuset_v2_live.rs moves the controller to this mount for a while.
    let _serial = cpuset_lock();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let Some(mount) = mounts
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .map(|f| PathBuf::from(f[1]))
    else {
        eprintln!("skipped: no cgroup2 mount");
        return;
    };
    let controllers = read(&mount.join("cgroup.controllers"));
    if controllers.split_whitespace().any(|c| c == "cpuset") {
        // Isolating in the real root would take the machine's cores: the fake tree stands in.
        eprintln!("skipped: cpuset is on cgroup v2 here ({}), not the hybrid this test is for", mount.display());
        return;
    }
    let daemon = Daemon::start("live", Some(&mount));
    let log = daemon.stop();
    let line = log.lines().find(|line| line.contains("cannot isolate cores")).unwrap_or_else(|| panic!("no refusal in: {log}"));
    let offered = if controllers.is_empty() { "none".to_string() } else { controllers };
    assert!(line.ends_with(&format!("cannot isolate cores: the cgroup2 at {} has no cpuset controller (it offers: {offered}; a kernel binds cpuset to a cgroup-v1 hierarchy when one mounts it)", mount.display())), "{line}");
    assert!(!log.contains("cpusets left by"), "nothing was taken over: {log}");
}

#[test]
fn an_enclave_gets_an_isolated_partition_and_everything_is_given_back() {
    if skipped(why_enclaves_cannot_boot(&vmm_binary())) {
        return;
    }
    let root = TempDir::new("clowder-fake-cgroup2");
    let online = read(Path::new("/sys/devices/system/cpu/online"));
    std::fs::write(root.0.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
    std::fs::write(root.0.join("cgroup.subtree_control"), "\n").unwrap();
    std::fs::write(root.0.join("cpuset.cpus.effective"), format!("{online}\n")).unwrap();
    std::fs::write(root.0.join("cgroup.procs"), "1\n").unwrap();

    let daemon = Daemon::start("fake", Some(&root.0));
    assert_eq!(read(&root.0.join("cgroup.subtree_control")), "+cpuset");
    let reply = daemon.call(json!({"op": "create", "name": "e", "cores": 1, "mem": "64M"}));
    let core = reply["enclave"]["cores"].as_str().unwrap().to_string();
    let vmm = reply["enclave"]["pid"].as_u64().unwrap();
    let group = root.0.join("clowder-enclave-e");
    let note = reply["notes"][0].as_str().unwrap_or_default();
    assert_eq!(
        note,
        format!(
            "cpusets: isolated partition {} on cores {core}, clowder-vmm in it; every other cgroup keeps cores {online}",
            group.display()
        )
    );
    assert_eq!(read(&group.join("cpuset.cpus")), core);
    assert_eq!(read(&group.join("cpuset.cpus.partition")), "isolated");
    assert_eq!(read(&group.join("cgroup.procs")), vmm.to_string());
    // v2 moves no host task: the kernel narrows every cgroup's effective cores instead.
    assert_eq!(read(&root.0.join("cgroup.procs")), "1");
    assert!(!root.0.join("clowder-host").exists());

    daemon.call(json!({"op": "rm", "name": "e"}));
    // Only a real cgroup can be removed with its control files in it.
    let log = daemon.stop();
    assert!(log.contains(&format!("giving enclave e's cores back to the host: removing {}", group.display())), "{log}");
    assert!(
        log.contains(&format!("cpusets: clowder-enclave-e (cores {core}): "))
            && log.contains("processes back to the root cgroup, NOT removed"),
        "{log}"
    );

    // A daemon that finds the partition (as after a crash) gives it back and says so.
    let log = Daemon::start("restart", Some(&root.0)).stop();
    assert!(log.contains(&format!("cpusets left by a clowderd that did not stop cleanly: clowder-enclave-e (cores {core})")), "{log}");
}
