//! `clowderd --isolate-cores` on this machine's real cgroup2 mount, not a mock (issue 23). The
//! machine is a hybrid: the kernel binds the cpuset controller to the cgroup-v1 hierarchy at
//! /sys/fs/cgroup/cpuset. A v1 hierarchy without child cgroups is destroyed when it is
//! unmounted, which frees the controller for cgroup2; so the test unmounts it, waits for
//! cpuset in the cgroup2 root's `cgroup.controllers`, and runs a daemon that finds cgroup v2 by
//! itself: an enclave's core becomes an isolated (or root) partition, the host's tasks lose the
//! core, the enclave boots, and `rm` gives the core back. Whatever happens (a failed assertion
//! included), a guard disables the controller again and remounts v1 exactly as it was.
//!
//! Skipped, saying why, unless run as root on such a hybrid with a v1 cpuset hierarchy that has
//! no children and that nothing holds open (umount refuses a busy mount), and where enclaves
//! boot. Serialised with the other cpuset tests by their lock file.

#[path = "support/cpuset_daemon.rs"]
mod cpuset_daemon;

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clowder_test_support::{cpuset_lock, vmm_binary, why_enclaves_cannot_boot};
use clowderd::cores::{format_cpu_list, parse_cpu_list};
use cpuset_daemon::{read, Daemon};
use serde_json::json;

const V1_ROOT: &str = "/sys/fs/cgroup/cpuset";

/// A mount as /proc/self/mountinfo describes it: what remounting it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mount {
    target: String,
    fstype: String,
    source: String,
    /// The per-mount options and the superblock's (`rw,relatime`, `rw,cpuset`).
    options: String,
    super_options: String,
}

/// The mount at `target`, from the mount table.
fn mount_at(target: &str) -> Option<Mount> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        (left.get(4) == Some(&target) && right.len() >= 3).then(|| Mount {
            target: target.into(),
            fstype: right[0].into(),
            source: right[1].into(),
            options: left[5].into(),
            super_options: right[2].into(),
        })
    })
}

/// Where the cgroup2 hierarchy is mounted.
fn cgroup2_root() -> Option<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mounts").ok()?;
    table.lines().map(|line| line.split(' ').collect::<Vec<_>>()).find(|f| f.get(2) == Some(&"cgroup2")).map(|f| PathBuf::from(f[1]))
}

fn offers_cpuset(root: &Path) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers")).is_ok_and(|c| c.split_whitespace().any(|c| c == "cpuset"))
}

/// Until `condition` holds, for at most `timeout`; whether it did.
fn wait_until(timeout: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The v1 cpuset hierarchy unmounted; dropping it (also while a failed assertion unwinds)
/// gives the controller back to v1: every `clowder-*` cgroup left in cgroup2 emptied into the
/// root and removed, cpuset disabled for the root's children, and v1 mounted again as it was.
struct V1Unmounted {
    mount: Mount,
    cgroup2: PathBuf,
}

impl V1Unmounted {
    /// Unmounts `mount`, or says why it cannot be.
    fn unmount(mount: Mount, cgroup2: PathBuf) -> Result<V1Unmounted, String> {
        let target = CString::new(mount.target.clone()).unwrap();
        // SAFETY: umount2 with a valid C string and no flags.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(format!("umount {}: {error} (something on this machine holds the v1 cpuset hierarchy open)", mount.target));
        }
        Ok(V1Unmounted { mount, cgroup2 })
    }

    /// Mounts v1 again (retrying while the controller's cgroup2 state is still going away).
    fn remount(&self) -> Result<(), String> {
        let per_mount: Vec<&str> = self.mount.options.split(',').filter(|o| *o != "rw").collect();
        let options: Vec<&str> =
            per_mount.iter().copied().chain(self.mount.super_options.split(',').filter(|o| *o != "rw" && !per_mount.contains(o))).collect();
        let mut last = String::new();
        for _ in 0..100 {
            let output = Command::new("mount")
                .args(["-t", &self.mount.fstype, "-o", &options.join(","), &self.mount.source, &self.mount.target])
                .output()
                .map_err(|e| format!("running mount: {e}"))?;
            if output.status.success() {
                return Ok(());
            }
            last = String::from_utf8_lossy(&output.stderr).trim().to_string();
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last)
    }
}

impl Drop for V1Unmounted {
    fn drop(&mut self) {
        let root_procs = self.cgroup2.join("cgroup.procs");
        for entry in std::fs::read_dir(&self.cgroup2).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("clowder-") && entry.path().is_dir() {
                for pid in std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default().lines() {
                    let _ = std::fs::write(&root_procs, pid);
                }
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let _ = std::fs::write(self.cgroup2.join("cgroup.subtree_control"), "-cpuset");
        match self.remount() {
            Ok(()) => eprintln!("cpuset_v2_live: {} mounted again", self.mount.target),
            Err(why) => eprintln!(
                "cpuset_v2_live: COULD NOT MOUNT {} AGAIN ({why}); by hand: mount -t {} -o {},{} {} {}",
                self.mount.target, self.mount.fstype, self.mount.options, self.mount.super_options, self.mount.source, self.mount.target
            ),
        }
    }
}

/// Why the test cannot run here; otherwise the v1 mount to take away and the cgroup2 root.
fn requirements() -> Result<(Mount, PathBuf), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("unmounting a cgroup hierarchy needs root".into());
    }
    let Some(cgroup2) = cgroup2_root() else { return Err("no cgroup2 mount".into()) };
    if offers_cpuset(&cgroup2) {
        return Err(format!("cpuset is on cgroup2 already ({}): not the hybrid this test is for", cgroup2.display()));
    }
    let Some(mount) = mount_at(V1_ROOT).filter(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "cpuset")) else {
        return Err(format!("no cgroup-v1 cpuset hierarchy at {V1_ROOT}"));
    };
    let children: Vec<String> = std::fs::read_dir(V1_ROOT)
        .map_err(|e| format!("reading {V1_ROOT}: {e}"))?
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    if !children.is_empty() {
        // Unmounted, it would live on, keeping the controller: and they are somebody's.
        return Err(format!("the v1 cpuset hierarchy has child cgroups ({})", children.join(", ")));
    }
    if std::fs::read_to_string("/sys/devices/system/cpu/online").is_ok_and(|online| parse_cpu_list(&online).is_ok_and(|c| c.len() < 2)) {
        return Err("an enclave takes a core: the host needs a second one".into());
    }
    if let Some(why) = why_enclaves_cannot_boot(&vmm_binary()) {
        return Err(why);
    }
    Ok((mount, cgroup2))
}

fn allowed_cores(pid: u32) -> String {
    let status = read(Path::new(&format!("/proc/{pid}/status")));
    status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string()
}

#[test]
fn isolate_cores_on_the_machines_cgroup2_mount() {
    let _serial = cpuset_lock();
    let (mount, cgroup2) = match requirements() {
        Ok(found) => found,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let v1_cores = read(&Path::new(V1_ROOT).join("cpuset.cpus"));
    let v1_mems = read(&Path::new(V1_ROOT).join("cpuset.mems"));
    let unmounted = match V1Unmounted::unmount(mount.clone(), cgroup2.clone()) {
        Ok(unmounted) => unmounted,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    if !wait_until(Duration::from_secs(5), || offers_cpuset(&cgroup2)) {
        drop(unmounted);
        // What can be checked here: the guard put v1 back as it was.
        assert_eq!(mount_at(V1_ROOT).as_ref(), Some(&mount), "v1 is not mounted as it was");
        assert_eq!((read(&Path::new(V1_ROOT).join("cpuset.cpus")), read(&Path::new(V1_ROOT).join("cpuset.mems"))), (v1_cores, v1_mems));
        eprintln!(
            "skipped: cpuset did not come to {} within 5 s of unmounting {V1_ROOT}: the hierarchy lives on, so something else \
             holds it (another mount of it, or an open file in it)",
            cgroup2.display()
        );
        return;
    }

    // A host task: a child of the test, in whatever cgroup the test runs.
    let mut host_task = Command::new("sleep").arg("600").spawn().unwrap();
    let all_cores = allowed_cores(host_task.id());
    let daemon = Daemon::start("live", None);
    assert_eq!(read(&cgroup2.join("cgroup.subtree_control")).split_whitespace().find(|c| *c == "cpuset"), Some("cpuset"));
    let reply = daemon.call(json!({"op": "create", "name": "e", "cores": 1, "mem": "64M"}));
    let core: usize = reply["enclave"]["cores"].as_str().unwrap().parse().unwrap();
    let vmm = reply["enclave"]["pid"].as_u64().unwrap();
    let group = cgroup2.join("clowder-enclave-e");
    let note = reply["notes"][0].as_str().unwrap_or_default();
    assert!(note.starts_with("cpusets: isolated partition") || note.starts_with("cpusets: root partition"), "{note}\n{}", daemon.log());
    let partition = read(&group.join("cpuset.cpus.partition"));
    assert!(partition == "isolated" || partition == "root", "the kernel says {partition}");
    assert_eq!(read(&group.join("cpuset.cpus.effective")), core.to_string());
    assert_eq!(read(&group.join("cgroup.procs")), vmm.to_string());
    let host_cores = format_cpu_list(parse_cpu_list(&all_cores).unwrap().into_iter().filter(|&c| c != core));
    assert_eq!(allowed_cores(host_task.id()), host_cores, "the host task still has the enclave's core");
    assert_eq!(read(&cgroup2.join("cpuset.cpus.effective")), host_cores);
    let listed = daemon.call(json!({"op": "ls"}));
    assert_eq!(listed["enclaves"][0]["state"], "ready", "{listed}");

    daemon.call(json!({"op": "rm", "name": "e"}));
    assert!(wait_until(Duration::from_secs(5), || !group.exists()), "{} outlived its enclave", group.display());
    assert_eq!(allowed_cores(host_task.id()), all_cores, "the host task did not get the core back");
    let log = daemon.stop();
    assert!(log.contains("enclave e's cores returned to the host"), "{log}");
    let _ = host_task.kill();
    let _ = host_task.wait();

    drop(unmounted);
    assert_eq!(mount_at(V1_ROOT).as_ref(), Some(&mount), "v1 is not mounted as it was");
    assert_eq!((read(&Path::new(V1_ROOT).join("cpuset.cpus")), read(&Path::new(V1_ROOT).join("cpuset.mems"))), (v1_cores, v1_mems));
    assert!(!offers_cpuset(&cgroup2), "cpuset is still on cgroup2");
}
