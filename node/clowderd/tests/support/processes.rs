//! Daemons and host processes as separate processes, for the XEMEM tests that need a
//! daemon they can kill or a tree of them (sub-managers): a `clowderd` binary on a private
//! directory, host programs whose output lines arrive on a channel, and the support programs
//! in this directory.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clowder_test_support::{daemon_answers_within, kernel_image, vmm_binary};
use clowderd::client::Client;
use serde_json::{json, Value};

/// A clowderd binary on a private directory; killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub dir: PathBuf,
}

impl Daemon {
    pub fn start(dir: &Path, upstream: Option<&Daemon>) -> Daemon {
        // Any existing file stands in for the kernel image: nothing boots.
        Daemon::start_with(dir, upstream, &["--kernel", env!("CARGO_BIN_EXE_clowderd")])
    }

    /// A daemon that runs LWK enclaves: with the built VMM and kernel.
    pub fn start_with_machines(dir: &Path, upstream: Option<&Daemon>) -> Daemon {
        let (vmm, kernel) = (vmm_binary(), kernel_image());
        Daemon::start_with(dir, upstream, &["--vmm", vmm.to_str().unwrap(), "--kernel", kernel.to_str().unwrap()])
    }

    /// Starts `clowderd OPTIONS` on `dir` (made if missing) and waits until it answers.
    pub fn start_with(dir: &Path, upstream: Option<&Daemon>, options: &[&str]) -> Daemon {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("clowderd.sock");
        let log = File::create(dir.join("clowderd.log")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_clowderd"));
        command.args(["--socket", socket.to_str().unwrap()]).args(options);
        if let Some(upstream) = upstream {
            command.arg("--xemem-upstream").arg(upstream.dir.join("xemem-peer.sock"));
        }
        command.env_remove("CLOWDER_XEMEM_SOCKET").env_remove("CLOWDER_SOCKET");
        let child = command.stderr(Stdio::from(log)).spawn().unwrap();
        let up = daemon_answers_within(&socket, Duration::from_secs(10));
        assert!(up, "clowderd did not come up: {}", std::fs::read_to_string(dir.join("clowderd.log")).unwrap_or_default());
        Daemon { child, dir: dir.to_path_buf() }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("clowderd.log")).unwrap_or_default()
    }

    /// Waits until the log has a line containing `needle`; returns the rest of that line.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return Some(line[line.find(needle).unwrap() + needle.len()..].trim().to_string());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The daemon's API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("clowderd.sock")
    }

    pub fn xemem_socket(&self) -> PathBuf {
        self.dir.join("xemem.sock")
    }

    pub fn call(&self, request: Value) -> Value {
        Client::connect_to(&self.socket()).unwrap().call(&request).unwrap()
    }

    pub fn segment_names(&self) -> Vec<String> {
        let listed = self.call(json!({"op": "xemem_ls"}));
        listed["segments"].as_array().cloned().unwrap_or_default().iter().filter_map(|s| s["name"].as_str().map(String::from)).collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host_peer process against `broker`, its output lines arriving on a channel.
pub struct HostProcess {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl HostProcess {
    pub fn start(program: &Path, broker: &Path, role: &str, name: &str, base: u64) -> HostProcess {
        HostProcess::spawn(program, broker, &[role, name, &base.to_string()])
    }

    pub fn spawn(program: &Path, broker: &Path, args: &[&str]) -> HostProcess {
        let mut child = Command::new(program)
            .args(args)
            .env("CLOWDER_XEMEM_SOCKET", broker)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        HostProcess { child, lines, seen: Vec::new() }
    }

    /// [`HostProcess::spawn`] of an owner (xemem/tests' `export_patterned_segment`, or
    /// `host_keeper`); returns once it has made its segment.
    pub fn owner(program: &Path, broker: &Path, args: &[&str]) -> HostProcess {
        let mut owner = HostProcess::spawn(program, broker, args);
        let made = owner.wait_for("made a segment of enclave", Duration::from_secs(120));
        assert!(made.is_some(), "{} made no segment: {:?}", program.display(), owner.seen);
        owner
    }

    /// Writes a line to the process's stdin.
    pub fn tell(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The rest of the first line starting with `prefix`.
    pub fn wait_for(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.seen.iter().find(|l| l.starts_with(prefix)) {
                return Some(line[prefix.len()..].trim().to_string());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => return None,
            }
        }
    }

    /// Waits for the exit (killing it after `timeout`); returns the status and every line.
    pub fn finish(mut self, timeout: Duration) -> (Option<i32>, String) {
        // End of input: a keeper exits without removing.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(50));
        self.seen.extend(self.lines.try_iter());
        (status, self.seen.join("\n"))
    }
}

/// Starts a sub-manager of `upstream` on `dir` and waits for its enclave id.
pub fn sub_manager(dir: &Path, upstream: &Daemon) -> (Daemon, u32) {
    with_id(Daemon::start(dir, Some(upstream)), upstream)
}

/// The name server at `dir/a`, then for each `(name, upstream)` in turn a sub-manager at
/// `dir/<name>` under the daemon named `upstream` ("a" or one started before it); returns A and
/// the sub-managers with their enclave ids.
pub fn daemon_tree<const N: usize>(dir: &Path, subs: [(&str, &str); N]) -> (Daemon, [(Daemon, u32); N]) {
    let a = Daemon::start(&dir.join("a"), None);
    let mut started: Vec<(Daemon, u32)> = Vec::with_capacity(N);
    for (name, upstream) in subs {
        let above = std::iter::once(&a).chain(started.iter().map(|(daemon, _)| daemon)).find(|daemon| daemon.dir.ends_with(upstream));
        let sub = sub_manager(&dir.join(name), above.unwrap_or_else(|| panic!("{name}'s upstream {upstream} is not started")));
        started.push(sub);
    }
    let Ok(subs) = started.try_into() else { unreachable!("one sub-manager for each of the {N}") };
    (a, subs)
}

/// Waits for `daemon`, a sub-manager of `upstream`, to get its enclave id.
pub fn with_id(daemon: Daemon, upstream: &Daemon) -> (Daemon, u32) {
    let id = daemon.wait_for_log("the name server gave this daemon enclave id", Duration::from_secs(10));
    let id = id.unwrap_or_else(|| panic!("{} got no id: {}\nupstream: {}", daemon.dir.display(), daemon.log(), upstream.log()));
    (daemon, id.parse().unwrap())
}

/// `node/clowderd/tests/support/<name>.c` built against libxpmem.a at `dir/<name>`.
pub fn support_program(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    super::cc_against_libxpmem(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support").join(format!("{name}.c")), &out);
    out
}
