//! The `clowderd` binary itself: options, one daemon per socket, clean exit on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clowderd::client::Client;
use serde_json::json;

struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("clowderd-bin-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the daemon on `socket`; any existing file stands in for the kernel image, since
/// nothing here boots.
fn start(socket: &Path) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_clowderd"))
        .args(["--socket", socket.to_str().unwrap(), "--kernel", env!("CARGO_BIN_EXE_clowderd")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Client::connect_to(socket).is_err() {
        assert!(Instant::now() < deadline, "clowderd did not come up");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn options_are_checked() {
    let help = Command::new(env!("CARGO_BIN_EXE_clowderd")).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--isolate-cores"));
    let unknown = Command::new(env!("CARGO_BIN_EXE_clowderd")).arg("--frobnicate").output().unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown option \"--frobnicate\""));
    let no_kernel = Command::new(env!("CARGO_BIN_EXE_clowderd")).args(["--kernel", "/nonexistent/lwk"]).output().unwrap();
    assert_eq!(no_kernel.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_kernel.stderr).contains("cargo build --release -p lwk"));
}

#[test]
fn one_daemon_per_socket_and_a_clean_exit_on_sigterm() {
    let dir = TempDir::new("lifecycle");
    let socket = dir.0.join("run/clowderd.sock");
    let mut daemon = start(&socket);
    let second = Command::new(env!("CARGO_BIN_EXE_clowderd"))
        .args(["--socket", socket.to_str().unwrap(), "--kernel", env!("CARGO_BIN_EXE_clowderd")])
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another clowderd is already listening"));

    let reply = Client::connect_to(&socket).unwrap().call(&json!({"op": "ls"})).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");

    clowderd::sys::send_signal(daemon.id(), libc::SIGTERM).unwrap();
    let status = daemon.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the socket is removed on exit");
    let error = Client::connect_to(&socket).err().unwrap();
    assert!(error.contains("clowderd is not running"), "{error}");
}
