//! XEMEM between the daemon and a real persistent LWK enclave: clowderd (in this process, with
//! the real `clowder-vmm` launcher) boots the LWK, whose XEMEM node finds the daemon's name
//! server over the enclave channel and gets an enclave id of its own; a second enclave gets
//! another. Needs /dev/kvm, the LWK image (cd kernels && cargo build --release -p lwk) and
//! clowder-vmm (cargo build --release -p clowder-vmm); skipped, with the reason, otherwise.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clowderd::client::Client;
use clowderd::daemon::{Daemon, DaemonConfig};
use clowderd::enclave::Liveness;
use clowderd::machine::VmmLauncher;
use clowderd::server;
use serde_json::{json, Value};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

fn kernel_image() -> PathBuf {
    workspace_root().join("kernels/target/x86_64-unknown-none/release/lwk")
}

fn vmm_binary() -> PathBuf {
    std::env::var_os("CLOWDER_VMM").map_or_else(|| workspace_root().join("target/release/clowder-vmm"), PathBuf::from)
}

fn missing_requirement() -> Option<String> {
    if File::options().read(true).write(true).open("/dev/kvm").is_err() {
        return Some("/dev/kvm is not available".into());
    }
    if !kernel_image().is_file() {
        return Some(format!("no LWK image at {}", kernel_image().display()));
    }
    if !vmm_binary().is_file() {
        return Some(format!("no clowder-vmm at {}", vmm_binary().display()));
    }
    None
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn call(socket: &Path, request: Value) -> Value {
    Client::connect_to(socket).unwrap().call(&request).unwrap()
}

/// Waits for the enclave's kernel to log the id the name server gave it.
fn xemem_id(socket: &Path, enclave: &str) -> Option<u32> {
    const LINE: &str = "[lwk] xemem: the name server gave this enclave id ";
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let logs = call(socket, json!({"op": "logs", "name": enclave}));
        let lines = logs["lines"].as_array().cloned().unwrap_or_default();
        if let Some(id) = lines.iter().filter_map(Value::as_str).find_map(|line| line.find(LINE).map(|at| line[at + LINE.len()..].trim().to_string())) {
            return id.parse().ok();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn lwk_enclaves_get_xemem_ids_from_the_daemon() {
    if let Some(why) = missing_requirement() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = TempDir(std::env::temp_dir().join(format!("clowderd-xemem-lwk-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let socket = dir.0.join("clowderd.sock");
    let launcher = VmmLauncher { vmm: vmm_binary(), kernel: kernel_image(), runtime_dir: dir.0.clone() };
    let config = DaemonConfig {
        vmm: vmm_binary(),
        kernel: kernel_image(),
        oneshot_memory: 64 << 20,
        isolate_cores: false,
        liveness: Liveness::default(),
        admin_group: None,
    };
    let daemon = Daemon::new(config, Box::new(launcher));
    let listener = server::bind(&socket).unwrap();
    std::thread::spawn(move || server::serve(daemon, listener));

    let mut ids = Vec::new();
    for name in ["a", "b"] {
        let created = call(&socket, json!({"op": "create", "name": name, "cores": 1, "mem": "128M"}));
        assert_eq!(created["ok"], true, "{created}");
        let id = xemem_id(&socket, name).unwrap_or_else(|| panic!("enclave {name} got no XEMEM id: {}", call(&socket, json!({"op": "logs", "name": name}))));
        ids.push(id);
    }
    assert!(ids.iter().all(|&id| id >= 2), "enclave 1 is the daemon's name server: {ids:?}");
    assert_ne!(ids[0], ids[1]);
    for name in ["a", "b"] {
        let removed = call(&socket, json!({"op": "rm", "name": name}));
        assert_eq!(removed["ok"], true, "{removed}");
    }
}
