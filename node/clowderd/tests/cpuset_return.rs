//! `clowderd --isolate-cores` gives the cores back: removing an enclave returns its cores to
//! the host's cpuset at once, a clean stop returns every host task to the root cpuset and
//! removes the daemon's cpusets, and a daemon started after one was killed repairs what the
//! dead one left, even without --isolate-cores. Each test makes a cpuset of its own below the real root and names it
//! `CLOWDER_CPUSET_ROOT`, so the daemon moves only the test's processes (a daemon and a `sleep`
//! standing for the host's tasks), never the machine's; whatever happens, the test's cpusets
//! and processes are gone when it ends. Needs root, a cgroup-v1 cpuset hierarchy, /dev/kvm, the
//! LWK image and clowder-vmm; skipped (with the reason) otherwise.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::{cpuset_lock, daemon_answers_within, kernel_image, vmm_binary, why_enclaves_cannot_boot, TempDir};
use clowderd::client::Client;
use clowderd::cores::{format_cpu_list, parse_cpu_list};
use serde_json::{json, Value};

const V1_ROOT: &str = "/sys/fs/cgroup/cpuset";

fn missing_requirement() -> Option<String> {
    if !Path::new(V1_ROOT).join("cpuset.cpus").exists() {
        return Some(format!("no cgroup-v1 cpuset hierarchy at {V1_ROOT}"));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("moving tasks between cpusets needs root".into());
    }
    if std::fs::read_to_string("/sys/devices/system/cpu/online").is_ok_and(|online| parse_cpu_list(&online).is_ok_and(|c| c.len() < 2)) {
        return Some("an enclave takes a core: the host needs a second one".into());
    }
    why_enclaves_cannot_boot(&vmm_binary())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The test's stand-in for the root cpuset, and the processes in it. Dropping it kills them
/// and returns everything to the machine as it was.
struct Sandbox {
    /// `/sys/fs/cgroup/cpuset/NAME`.
    root: PathBuf,
    /// Its name as /proc/PID/cpuset shows it.
    name: String,
    /// Cores of the real root: all the sandbox's.
    cores: String,
    host_task: Child,
    daemons: Vec<Child>,
    dir: TempDir,
    /// Held until everything above is cleaned up (fields drop after `Drop::drop`, in order).
    _serial: File,
}

impl Sandbox {
    /// The sandbox of `test`, or None, saying why on stderr, where the test cannot run here.
    fn for_test(test: &str) -> Option<Sandbox> {
        if let Some(why) = missing_requirement() {
            eprintln!("skipped: {why}");
            return None;
        }
        // One enclave at a time on a machine of two cores, and no other test's cpusets meanwhile.
        let _serial = cpuset_lock();
        let name = format!("/cpuset-test-clowderd-{}-{test}", std::process::id());
        let root = PathBuf::from(format!("{V1_ROOT}{name}"));
        let _ = std::fs::create_dir(&root);
        let cores = read(&Path::new(V1_ROOT).join("cpuset.cpus"));
        std::fs::write(root.join("cpuset.mems"), read(&Path::new(V1_ROOT).join("cpuset.mems"))).unwrap();
        std::fs::write(root.join("cpuset.cpus"), &cores).unwrap();
        let host_task = Command::new("sleep").arg("600").spawn().unwrap();
        std::fs::write(root.join("cgroup.procs"), host_task.id().to_string()).unwrap();
        Some(Sandbox { root, name, cores, host_task, daemons: Vec::new(), dir: TempDir::new(&format!("clowder-cpuset-{test}")), _serial })
    }

    /// Starts an isolating daemon, creates enclave `e` and kills the daemon (SIGKILL), leaving
    /// what a crash leaves; returns the enclave's core.
    fn crash_with_an_enclave(&mut self) -> String {
        self.start_daemon("", true);
        let (core, vmm) = self.create_enclave("e");
        self.stop_daemon(libc::SIGKILL);
        wait_for_exit(vmm);
        core
    }

    fn socket(&self) -> PathBuf {
        self.dir.0.join("clowderd.sock")
    }

    fn log_path(&self, daemon: usize) -> PathBuf {
        self.dir.0.join(format!("clowderd-{daemon}.log"))
    }

    /// The daemon's log (its stderr) so far.
    fn log(&self, daemon: usize) -> String {
        std::fs::read_to_string(self.log_path(daemon)).unwrap_or_default()
    }

    /// Starts a daemon (isolating cores if `isolate`) in the sandbox's cpuset `group` (as a
    /// shell confined there would start it: it is in the group before it runs) and waits until
    /// it answers.
    fn start_daemon(&mut self, group: &str, isolate: bool) {
        let log = File::create(self.log_path(self.daemons.len())).unwrap();
        let daemon = Command::new("sh")
            .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(self.root.join(group).join("cgroup.procs"))
            .arg(env!("CARGO_BIN_EXE_clowderd"))
            .args(isolate.then_some("--isolate-cores"))
            .arg("--socket")
            .arg(self.socket())
            .arg("--kernel")
            .arg(kernel_image())
            .arg("--vmm")
            .arg(vmm_binary())
            .env("CLOWDER_CPUSET_ROOT", &self.root)
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        self.daemons.push(daemon);
        let log = || self.log(self.daemons.len() - 1);
        assert!(daemon_answers_within(&self.socket(), Duration::from_secs(10)), "clowderd did not come up: {}", log());
        // The socket is bound before the daemon takes its cpusets over: an answer comes after.
        self.call(json!({"op": "ls"}));
    }

    fn call(&self, request: Value) -> Value {
        let reply = Client::connect_to(&self.socket()).unwrap().call(&request).unwrap();
        assert_eq!(reply["ok"], true, "{request}: {reply}");
        reply
    }

    /// Creates a one-core enclave; returns its core and its VMM's pid.
    fn create_enclave(&self, name: &str) -> (String, u32) {
        let reply = self.call(json!({"op": "create", "name": name, "cores": 1, "mem": "64M"}));
        let enclave = &reply["enclave"];
        (enclave["cores"].as_str().unwrap().to_string(), enclave["pid"].as_u64().unwrap() as u32)
    }

    /// The host's cores while an enclave holds `core`.
    fn all_but(&self, core: &str) -> String {
        let core: usize = core.parse().unwrap();
        format_cpu_list(parse_cpu_list(&self.cores).unwrap().into_iter().filter(|&c| c != core))
    }

    /// The sandbox's cpusets (`clowder-host`, `clowder-enclave-NAME`).
    fn groups(&self) -> Vec<String> {
        let mut groups: Vec<String> = std::fs::read_dir(&self.root)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|entry| entry.path().is_dir())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        groups.sort();
        groups
    }

    /// Where the host task is and which cores it may run on.
    fn host_task(&self) -> (String, String) {
        let pid = self.host_task.id();
        let cpuset = read(Path::new(&format!("/proc/{pid}/cpuset")));
        let status = read(Path::new(&format!("/proc/{pid}/status")));
        let allowed = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
        (cpuset, allowed)
    }

    fn stop_daemon(&mut self, signal: i32) {
        let daemon = self.daemons.last_mut().unwrap();
        clowderd::sys::send_signal(daemon.id(), signal).unwrap();
        daemon.wait().unwrap();
    }
}

fn wait_for_exit(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for child in self.daemons.iter_mut().chain(std::iter::once(&mut self.host_task)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The daemons' VMMs follow them; whatever is left goes back to the real root.
        let real_procs = Path::new(V1_ROOT).join("cgroup.procs");
        for _ in 0..100 {
            let mut groups: Vec<PathBuf> = std::fs::read_dir(&self.root)
                .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()).collect())
                .unwrap_or_default();
            groups.push(self.root.clone());
            for group in &groups {
                for pid in std::fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default().lines() {
                    let _ = std::fs::write(&real_procs, pid);
                }
                let _ = std::fs::remove_dir(group);
            }
            if !self.root.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("could not remove {}", self.root.display());
    }
}

#[test]
fn removing_an_enclave_gives_its_cores_back_to_the_host_at_once() {
    let Some(mut sandbox) = Sandbox::for_test("rm") else { return };
    sandbox.start_daemon("", true);
    let (core, _) = sandbox.create_enclave("e");
    let host_cores = sandbox.all_but(&core);
    assert_eq!(sandbox.host_task(), (format!("{}/clowder-host", sandbox.name), host_cores.clone()), "{}", sandbox.log(0));
    assert_eq!(read(&sandbox.root.join("clowder-enclave-e/cpuset.cpus")), core);

    sandbox.call(json!({"op": "rm", "name": "e"}));
    assert_eq!(sandbox.host_task(), (format!("{}/clowder-host", sandbox.name), sandbox.cores.clone()), "{}", sandbox.log(0));
    assert_eq!(read(&sandbox.root.join("clowder-host/cpuset.cpus")), sandbox.cores);
    assert_eq!(sandbox.groups(), ["clowder-host"]);
    assert!(sandbox.log(0).contains("enclave e's cores returned to the host"), "{}", sandbox.log(0));

    // The daemon, confined with the host while the enclave ran, can give the core out again.
    let (again, _) = sandbox.create_enclave("f");
    assert_eq!(again, core);
    assert_eq!(sandbox.host_task().1, host_cores);
}

#[test]
fn a_clean_stop_returns_every_host_task_to_the_root_cpuset() {
    let Some(mut sandbox) = Sandbox::for_test("stop") else { return };
    sandbox.start_daemon("", true);
    let (core, vmm) = sandbox.create_enclave("e");
    assert_eq!(sandbox.host_task().1, sandbox.all_but(&core));

    sandbox.stop_daemon(libc::SIGTERM);
    wait_for_exit(vmm);
    assert_eq!(sandbox.host_task(), (sandbox.name.clone(), sandbox.cores.clone()), "{}", sandbox.log(0));
    assert!(sandbox.groups().is_empty(), "left behind: {:?}", sandbox.groups());
    let log = sandbox.log(0);
    assert!(log.contains("clowder-host (cores ") && log.contains("processes back to the root cpuset, removed"), "{log}");
}

#[test]
fn a_daemon_started_after_a_crash_repairs_the_cpusets_it_left() {
    let Some(mut sandbox) = Sandbox::for_test("crash") else { return };
    let core = sandbox.crash_with_an_enclave();
    // What a crash leaves: the host confined, and the enclave's cpuset.
    assert_eq!(sandbox.host_task(), (format!("{}/clowder-host", sandbox.name), sandbox.all_but(&core)));
    assert_eq!(sandbox.groups(), ["clowder-enclave-e", "clowder-host"]);

    // Started from a shell that is still confined, as an operator would.
    sandbox.start_daemon("clowder-host", true);
    assert_eq!(sandbox.host_task(), (sandbox.name.clone(), sandbox.cores.clone()), "{}", sandbox.log(1));
    assert!(sandbox.groups().is_empty(), "left behind: {:?}", sandbox.groups());
    let log = sandbox.log(1);
    assert!(log.contains("cpusets left by a clowderd that did not stop cleanly"), "{log}");
    assert!(log.contains("clowder-enclave-e (cores ") && log.contains("clowder-host (cores "), "{log}");

    // And isolates afresh.
    let (core, _) = sandbox.create_enclave("e");
    assert_eq!(sandbox.host_task().1, sandbox.all_but(&core));
}

#[test]
fn a_daemon_that_does_not_isolate_still_repairs_what_a_killed_one_left() {
    let Some(mut sandbox) = Sandbox::for_test("plain") else { return };
    let core = sandbox.crash_with_an_enclave();
    assert_eq!(sandbox.host_task().1, sandbox.all_but(&core));

    sandbox.start_daemon("clowder-host", false);
    assert_eq!(sandbox.host_task(), (sandbox.name.clone(), sandbox.cores.clone()), "{}", sandbox.log(1));
    assert!(sandbox.groups().is_empty(), "left behind: {:?}", sandbox.groups());
    assert!(sandbox.log(1).contains("cpusets left by a clowderd that did not stop cleanly"), "{}", sandbox.log(1));
}
