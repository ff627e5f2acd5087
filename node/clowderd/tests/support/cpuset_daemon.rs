//! What the cgroup-v2 cpuset tests share: a clowderd isolating cores, logging to a file, and a
//! trimmed read of a control file. Included by path (not through `support`), so these tests
//! build none of the KVM tests' helpers.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clowder_test_support::{daemon_answers_within, kernel_image, vmm_binary, TempDir};
use clowderd::client::Client;
use serde_json::{json, Value};

/// A control file's (or /proc file's) text, trimmed; panics naming the file it cannot read.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A clowderd with --isolate-cores, logging to a file in its scratch directory.
pub struct Daemon {
    child: Child,
    dir: TempDir,
}

impl Daemon {
    /// Starts one in the scratch directory `clowder-cgroup2-{test}`, isolating in the hierarchy
    /// `cpuset_root` (`CLOWDER_CPUSET_ROOT`), or, with None, the one it finds by itself; returns
    /// once it answers.
    pub fn start(test: &str, cpuset_root: Option<&Path>) -> Daemon {
        let dir = TempDir::new(&format!("clowder-cgroup2-{test}"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_clowderd"));
        command
            .args(["--isolate-cores", "--socket"])
            .arg(dir.0.join("clowderd.sock"))
            .arg("--kernel")
            .arg(kernel_image())
            .arg("--vmm")
            .arg(vmm_binary())
            .stderr(Stdio::from(File::create(dir.0.join("clowderd.log")).unwrap()));
        match cpuset_root {
            Some(root) => command.env("CLOWDER_CPUSET_ROOT", root),
            None => command.env_remove("CLOWDER_CPUSET_ROOT"),
        };
        let daemon = Daemon { child: command.spawn().unwrap(), dir };
        assert!(
            daemon_answers_within(&daemon.dir.0.join("clowderd.sock"), Duration::from_secs(10)),
            "clowderd did not come up: {}",
            daemon.log()
        );
        // The socket is bound before the daemon takes its cgroups over: an answer comes after.
        daemon.call(json!({"op": "ls"}));
        daemon
    }

    /// Sends `request`, asserting it succeeded.
    pub fn call(&self, request: Value) -> Value {
        let reply = Client::connect_to(&self.dir.0.join("clowderd.sock")).unwrap().call(&request).unwrap();
        assert_eq!(reply["ok"], true, "{request}: {reply}\n{}", self.log());
        reply
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("clowderd.log")).unwrap_or_default()
    }

    /// Stops it with SIGTERM (a clean stop) and returns its log.
    pub fn stop(mut self) -> String {
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
