//! The `clowderd` binary itself: options, one daemon per socket, clean exit on SIGTERM.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clowder_test_support::{daemon_answers_within, TempDir};
use clowderd::client::Client;
use serde_json::json;

/// Starts the daemon on `socket`; any existing file stands in for the kernel image, since
/// nothing here boots.
fn start(socket: &Path) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_clowderd"))
        .args(["--socket", socket.to_str().unwrap(), "--kernel", env!("CARGO_BIN_EXE_clowderd")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(daemon_answers_within(socket, Duration::from_secs(10)), "clowderd did not come up");
    child
}

#[test]
fn options_are_checked() {
    let help = Command::new(env!("CARGO_BIN_EXE_clowderd")).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--isolate-cores"));
    let version = Command::new(env!("CARGO_BIN_EXE_clowderd")).arg("--version").output().unwrap();
    assert!(version.status.success());
    let expected = format!("clowderd {} (API {})", env!("CARGO_PKG_VERSION"), clowder_api::API_VERSION);
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), expected);
    let vmm = std::path::Path::new(env!("CARGO_BIN_EXE_clowderd")).with_file_name("clowder-vmm");
    if let Ok(version) = Command::new(&vmm).arg("--version").output() {
        // Built by the same `cargo build` (clowderd starts it), so of the same version.
        assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), format!("clowder-vmm {}", env!("CARGO_PKG_VERSION")));
    }
    let unknown = Command::new(env!("CARGO_BIN_EXE_clowderd")).arg("--frobnicate").output().unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown option \"--frobnicate\""));
    let no_connections = Command::new(env!("CARGO_BIN_EXE_clowderd")).args(["--max-connections-per-user", "0"]).output().unwrap();
    assert_eq!(no_connections.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_connections.stderr).contains("--max-connections-per-user: \"0\" is not a count of at least 1"));
    let no_kernel = Command::new(env!("CARGO_BIN_EXE_clowderd")).args(["--kernel", "/nonexistent/lwk"]).output().unwrap();
    assert_eq!(no_kernel.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_kernel.stderr).contains("cargo build --release -p lwk"));
}

#[test]
fn one_daemon_per_socket_and_a_clean_exit_on_sigterm() {
    let dir = TempDir::new("clowderd-bin-lifecycle");
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
