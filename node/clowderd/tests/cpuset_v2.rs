//! `clowderd --isolate-cores` on cgroup v2. This machine's kernel binds the cpuset controller
//! to its cgroup-v1 hierarchy (a hybrid: the cgroup2 mount offers no cpuset), so no v2 cpuset
//! partition can be made live here. What runs live: the daemon pointed at the machine's real
//! cgroup2 mount says, in one line, that it has no cpuset controller. What runs against a
//! directory that mimics a cgroup2 root (its control files are plain files, so nothing is
//! enforced and a directory with files cannot be removed): a real enclave's VMM goes into an
//! isolated partition of its core, host tasks are left where they are, and removal, a clean
//! stop and a restart give back and report what the daemon made.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clowder_test_support::{cpuset_lock, daemon_answers_within, kernel_image, vmm_binary, why_enclaves_cannot_boot, TempDir};
use clowderd::client::Client;
use serde_json::{json, Value};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A clowderd isolating cores in the cgroup hierarchy `root`, logging to a file.
struct Daemon {
    child: Child,
    dir: TempDir,
}

impl Daemon {
    fn start(root: &Path, test: &str) -> Daemon {
        let dir = TempDir::new(&format!("clowder-cgroup2-{test}"));
        let child = Command::new(env!("CARGO_BIN_EXE_clowderd"))
            .arg("--isolate-cores")
            .arg("--socket")
            .arg(dir.0.join("clowderd.sock"))
            .arg("--kernel")
            .arg(kernel_image())
            .arg("--vmm")
            .arg(vmm_binary())
            .env("CLOWDER_CPUSET_ROOT", root)
            .stderr(Stdio::from(File::create(dir.0.join("clowderd.log")).unwrap()))
            .spawn()
            .unwrap();
        let daemon = Daemon { child, dir };
        assert!(
            daemon_answers_within(&daemon.dir.0.join("clowderd.sock"), Duration::from_secs(10)),
            "clowderd did not come up: {}",
            daemon.log()
        );
        // The socket is bound before the daemon takes its cgroups over: an answer comes after.
        daemon.call(json!({"op": "ls"}));
        daemon
    }

    fn call(&self, request: Value) -> Value {
        let reply = Client::connect_to(&self.dir.0.join("clowderd.sock")).unwrap().call(&request).unwrap();
        assert_eq!(reply["ok"], true, "{request}: {reply}");
        reply
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("clowderd.log")).unwrap_or_default()
    }

    /// Stops it with SIGTERM (a clean stop) and returns its log.
    fn stop(mut self) -> String {
        clowderd::sys::send_signal(self.child.id(), libc::SIGTERM).unwrap();
        self.child.wait().unwrap();
        self.log()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let daemon = Daemon::start(&mount, "live");
    let log = daemon.stop();
    let line = log.lines().find(|line| line.contains("cannot isolate cores")).unwrap_or_else(|| panic!("no refusal in: {log}"));
    let offered = if controllers.is_empty() { "none".to_string() } else { controllers };
    assert!(line.ends_with(&format!("cannot isolate cores: the cgroup2 at {} has no cpuset controller (it offers: {offered}; a kernel binds cpuset to a cgroup-v1 hierarchy when one mounts it)", mount.display())), "{line}");
    assert!(!log.contains("cpusets left by"), "nothing was taken over: {log}");
}

#[test]
fn an_enclave_gets_an_isolated_partition_and_everything_is_given_back() {
    if let Some(why) = why_enclaves_cannot_boot(&vmm_binary()) {
        eprintln!("skipped: {why}");
        return;
    }
    let root = TempDir::new("clowder-fake-cgroup2");
    let online = read(Path::new("/sys/devices/system/cpu/online"));
    std::fs::write(root.0.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
    std::fs::write(root.0.join("cgroup.subtree_control"), "\n").unwrap();
    std::fs::write(root.0.join("cpuset.cpus.effective"), format!("{online}\n")).unwrap();
    std::fs::write(root.0.join("cgroup.procs"), "1\n").unwrap();

    let daemon = Daemon::start(&root.0, "fake");
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
    let log = Daemon::start(&root.0, "restart").stop();
    assert!(log.contains(&format!("cpusets left by a clowderd that did not stop cleanly: clowder-enclave-e (cores {core})")), "{log}");
}
