//! What the CLI's end-to-end tests share beyond clowder-test-support: which VMM they boot
//! with, whether this machine can boot an enclave at all, a daemon to run `clowder` against,
//! and the run's output as text.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use clowder_test_support::{lwk_daemon, serve, skipped, TempDir};
use clowderd::enclave::Liveness;

/// The `clowder` binary under test: `CLOWDER_CLI`, else the workspace's release build. This
/// package only tests the CLI (so the CLI's own package needs no daemon or KVM crates), and cargo
/// names a binary only to its own package's tests: build it first (`make build`, or
/// `cargo build --release -p clowder-cli`).
pub fn clowder() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::var_os("CLOWDER_CLI")
            .map_or_else(|| clowder_test_support::workspace_root().join("target/release/clowder"), PathBuf::from);
        assert!(path.is_file(), "no clowder at {} (cargo build --release -p clowder-cli)", path.display());
        path.to_str().expect("a UTF-8 path").to_owned()
    })
}

/// `CLOWDER_VMM`, else the clowder-vmm built beside the CLI, else the workspace's release build.
pub fn vmm_binary() -> PathBuf {
    let beside_cli = Path::new(clowder()).with_file_name("clowder-vmm");
    if std::env::var_os("CLOWDER_VMM").is_none() && beside_cli.is_file() {
        return beside_cli;
    }
    clowder_test_support::vmm_binary()
}

/// Why the tests that boot something cannot run here, if they cannot.
pub fn missing_requirement() -> Option<String> {
    clowder_test_support::why_jobs_cannot_run(&vmm_binary())
}

/// Whether a test that boots enclaves and runs `tool` (`need`: what for) must be skipped here,
/// the reason printed.
pub fn skipped_without(tool: &str, need: &str) -> bool {
    let tool_missing = || Command::new(tool).arg("--version").output().is_err().then(|| format!("needs {tool} {need}"));
    skipped(missing_requirement().or_else(tool_missing))
}

/// A scratch directory `name` and the socket of an in-process daemon (`liveness`) serving in it,
/// or `None` (the reason printed: the test is skipped) where enclaves cannot boot here.
pub fn enclave_test_daemon(name: &str, liveness: Liveness) -> Option<(TempDir, PathBuf)> {
    (!skipped(missing_requirement())).then(|| test_daemon(name, liveness))
}

/// A scratch directory `name` and the socket of an in-process daemon (`liveness`) serving in it.
pub fn test_daemon(name: &str, liveness: Liveness) -> (TempDir, PathBuf) {
    let dir = TempDir::new(name);
    let socket = start_daemon(&dir.0, liveness);
    (dir, socket)
}

/// An in-process daemon (`liveness`) whose enclaves boot the built LWK, serving in `dir`: its
/// socket.
pub fn start_daemon(dir: &Path, liveness: Liveness) -> PathBuf {
    serve(lwk_daemon(dir, vmm_binary(), liveness), dir)
}

/// A daemon for test `name` with `program` built from C `source` and an enclave `two` on CPUs 0
/// and 1 with `mem` of memory, or `None` where enclaves cannot boot here (the reason printed).
pub fn two_cpu_enclave_with(name: &str, program: &str, source: &str, mem: &str) -> Option<(TempDir, PathBuf)> {
    let (dir, socket) = enclave_test_daemon(name, Liveness::default())?;
    clowder_test_support::build_musl_program(&dir.0, program, source);
    run_clowder_ok(&socket, &["enclave", "create", "--name", "two", "--cores", "0,1", "--mem", mem], &dir.0);
    Some((dir, socket))
}

/// Runs C `source` as `./program` in a fresh two-CPU enclave (test `name`): it must print
/// exactly `expected` and succeed.
pub fn two_cpu_job_prints(name: &str, program: &str, source: &str, expected: &str) {
    let Some((dir, socket)) = two_cpu_enclave_with(name, program, source, "256M") else { return };
    let output = run_clowder(&socket, &["run", "--enclave", "two", &format!("./{program}")], &dir.0);
    assert_eq!(text(&output.stdout), expected, "stderr: {}", text(&output.stderr));
    assert!(output.status.success(), "{:?}: {}", output.status, text(&output.stderr));
    run_clowder_ok(&socket, &["enclave", "rm", "two"], &dir.0);
}

/// `clowder ARGS` run in `cwd` against the daemon at `socket`.
pub fn run_clowder(socket: &Path, args: &[&str], cwd: &Path) -> Output {
    Command::new(clowder()).args(args).current_dir(cwd).env("CLOWDER_SOCKET", socket).output().unwrap()
}

/// [`run_clowder`] that must succeed (its output shown where it did not).
pub fn run_clowder_ok(socket: &Path, args: &[&str], cwd: &Path) -> Output {
    let output = run_clowder(socket, args, cwd);
    assert!(output.status.success(), "clowder {}: {}{}", args.join(" "), text(&output.stdout), text(&output.stderr));
    output
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `output`'s stderr says `words`.
pub fn assert_says(output: &Output, words: &str) {
    let stderr = text(&output.stderr);
    assert!(stderr.contains(words), "expected {words:?} in: {stderr}");
}

/// A C program that prints "tick" every `period_ms` milliseconds for ever, spinning in user mode
/// on the vDSO clock between lines (a job that keeps its CPU busy until it is killed).
pub fn tick_job(period_ms: u32) -> String {
    format!(
        r#"#include <stdio.h>
#include <time.h>
int main(void) {{
    for (;;) {{
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        do clock_gettime(CLOCK_MONOTONIC, &now);
        while ((now.tv_sec - start.tv_sec) * 1000000000L + now.tv_nsec - start.tv_nsec < {period_ms}000000L);
        printf("tick\n");
        fflush(stdout);
    }}
}}
"#
    )
}

/// The clowder-vmm pid of enclave `name`.
pub fn vmm_pid(socket: &Path, dir: &Path, name: &str) -> u32 {
    let listing: serde_json::Value = serde_json::from_slice(&run_clowder(socket, &["--json", "enclave", "ls"], dir).stdout).unwrap();
    let enclave = listing["enclaves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no enclave {name}: {listing}"));
    enclave["pid"].as_u64().expect("a pid") as u32
}
