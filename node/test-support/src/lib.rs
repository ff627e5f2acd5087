//! What the integration tests of clowderd and clowder-cli share: scratch directories, where
//! the built LWK image and VMM are, whether enclaves can boot here, and daemons to test
//! against.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clowderd::client::Client;
use clowderd::daemon::{Daemon, DaemonConfig};
use clowderd::enclave::Liveness;
use clowderd::machine::VmmLauncher;
use clowderd::server;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

/// `CLOWDER_KERNEL` (as clowderd reads it: a test may boot another build of the LWK), else the
/// workspace's release build.
pub fn kernel_image() -> PathBuf {
    std::env::var_os("CLOWDER_KERNEL")
        .map_or_else(|| workspace_root().join("kernels/target/x86_64-unknown-none/release/lwk"), PathBuf::from)
}

/// `CLOWDER_VMM`, or the workspace's release build of clowder-vmm.
pub fn vmm_binary() -> PathBuf {
    std::env::var_os("CLOWDER_VMM").map_or_else(|| workspace_root().join("target/release/clowder-vmm"), PathBuf::from)
}

/// Why LWK enclaves cannot boot here with the VMM at `vmm`, if they cannot.
pub fn why_enclaves_cannot_boot(vmm: &Path) -> Option<String> {
    if File::options().read(true).write(true).open("/dev/kvm").is_err() {
        return Some("/dev/kvm is not available".into());
    }
    if !kernel_image().is_file() {
        return Some(format!("no LWK image at {} (cd kernels && cargo build --release -p lwk)", kernel_image().display()));
    }
    if !vmm.is_file() {
        return Some(format!("no clowder-vmm at {} (cargo build --release -p clowder-vmm)", vmm.display()));
    }
    None
}

/// Whether a test must be skipped because of `why` (one of the `why_…` above), the reason
/// printed: `if skipped(why_enclaves_cannot_boot(&vmm)) { return; }`.
pub fn skipped(why: Option<String>) -> bool {
    if let Some(why) = &why {
        eprintln!("skipped: {why}");
    }
    why.is_some()
}

/// Why LWK jobs (static musl programs) cannot be built and run here with the VMM at `vmm`.
pub fn why_jobs_cannot_run(vmm: &Path) -> Option<String> {
    if let Some(why) = why_enclaves_cannot_boot(vmm) {
        return Some(why);
    }
    if std::process::Command::new("musl-gcc").arg("--version").output().is_err() {
        return Some("musl-gcc is not installed".into());
    }
    None
}

/// The helpers every test program may include as `"clowder_test.h"` (CPU binding, a clock).
pub const TEST_PROGRAM_HEADER: &str = include_str!("../c/clowder_test.h");

/// Builds the static musl program `dir/name` from C `source` (kept as `dir/name.c`, with
/// [`TEST_PROGRAM_HEADER`] beside it), threads allowed.
pub fn build_musl_program(dir: &Path, name: &str, source: &str) -> PathBuf {
    std::fs::write(dir.join("clowder_test.h"), TEST_PROGRAM_HEADER).unwrap();
    let source_path = dir.join(format!("{name}.c"));
    std::fs::write(&source_path, source).unwrap();
    let binary = dir.join(name);
    let status =
        std::process::Command::new("musl-gcc").args(["-static", "-O2", "-pthread", "-o"]).arg(&binary).arg(&source_path).status().unwrap();
    assert!(status.success(), "musl-gcc failed for {name}");
    binary
}

/// A job that touches `argv[1]` MiB of heap, one write per page, and prints the sum of what it
/// read first (0: the memory came cleared).
pub const TOUCH_HEAP_JOB: &str = r#"#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    size_t bytes = (size_t)atol(argv[1]) << 20;
    unsigned char *memory = malloc(bytes);
    if (!memory) return 1;
    unsigned long sum = 0;
    for (size_t i = 0; i < bytes; i += 4096) { sum += memory[i]; memory[i] = 1; }
    printf("touched %zu MiB, sum %lu\n", bytes >> 20, sum);
    return 0;
}
"#;

/// A scratch directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `NAME-PID` under the system's temporary directory, empty.
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
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

/// A daemon's configuration as the tests use it: 64 MiB one-shot enclaves, no core isolation,
/// no admin group.
pub fn daemon_config(vmm: PathBuf, kernel: PathBuf, liveness: Liveness) -> DaemonConfig {
    DaemonConfig { vmm, kernel, oneshot_memory: 64 << 20, isolate_cores: false, liveness, admin_group: None }
}

/// A daemon whose enclaves boot the built LWK image with the VMM at `vmm`, their control
/// sockets in `dir`. Not serving yet: see [`serve`].
pub fn lwk_daemon(dir: &Path, vmm: PathBuf, liveness: Liveness) -> Arc<Daemon> {
    let launcher = VmmLauncher { vmm: vmm.clone(), kernel: kernel_image(), runtime_dir: dir.to_path_buf() };
    Daemon::new(daemon_config(vmm, kernel_image(), liveness), Box::new(launcher))
}

/// Serves `daemon` on `dir`/clowderd.sock from a thread of this process; returns the socket.
pub fn serve(daemon: Arc<Daemon>, dir: &Path) -> PathBuf {
    let socket = dir.join("clowderd.sock");
    let listener = server::bind(&socket).unwrap();
    std::thread::spawn(move || server::serve(daemon, listener));
    socket
}

/// Waits up to `timeout` for a daemon (a started clowderd process) to answer on `socket`:
/// whether one did.
pub fn daemon_answers_within(socket: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Client::connect_to(socket).is_err() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Held by every test that changes the machine's cpusets (tests/cpuset_*.rs of clowderd): they
/// isolate cores in the real hierarchies, and one even unmounts the cgroup-v1 cpuset, so no two
/// may run at once, whether as threads of one test binary or as two cargo runs. The lock (an
/// exclusive `flock`, per open file) goes when the file is dropped or the process dies.
pub fn cpuset_lock() -> File {
    let path = std::env::temp_dir().join("clowder-cpuset-tests.lock");
    let file = File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    file.lock().unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    file
}
