//! What the daemon's KVM tests share: where the kernel and the VMM are, whether enclaves can
//! run here and scratch directories (from clowder-test-support), LWK jobs built from
//! xemem/tests, and the XEMEM ids LWK enclaves got.
#![allow(dead_code, unused_imports)] // each test crate uses its own part

pub mod hugepages;
pub mod processes;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use clowder_test_support::{kernel_image, vmm_binary, workspace_root, TempDir};
use clowderd::client::Client;
use serde_json::{json, Value};

/// Why LWK enclaves cannot run here, if they cannot.
pub fn missing_requirement() -> Option<String> {
    clowder_test_support::why_enclaves_cannot_boot(&vmm_binary())
}

/// Why LWK jobs built with musl-gcc cannot run here, if they cannot.
pub fn missing_job_requirement() -> Option<String> {
    clowder_test_support::why_jobs_cannot_run(&vmm_binary())
}

/// One request to the daemon at `socket`, and its reply.
pub fn call(socket: &Path, request: Value) -> Value {
    Client::connect_to(socket).unwrap().call(&request).unwrap()
}

/// Builds the host program `xemem/tests/<source>` against the host's libxpmem.a.
pub fn build_host_program(source: &str, out: &Path) {
    let xemem = workspace_root().join("xemem");
    assert!(Command::new("make").arg("-s").arg("-C").arg(&xemem).status().unwrap().success(), "make -C xemem");
    let built = Command::new("cc")
        .args(["-O2", "-I"])
        .arg(xemem.join("include"))
        .arg("-o")
        .arg(out)
        .arg(xemem.join("tests").join(source))
        .arg(xemem.join("build/lib/libxpmem.a"))
        .arg("-lpthread")
        .status()
        .unwrap();
    assert!(built.success(), "building {source}");
}

/// Builds the LWK job `xemem/tests/<source>` statically with musl, against a musl build of
/// libxpmem.a (musl has no kernel headers: the system's linux/ and asm/ are linked in).
pub fn build_musl_job(source: &str, out: &Path) -> Result<(), String> {
    // Tests run in parallel and share xemem/build/musl: one build at a time.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let xemem = workspace_root().join("xemem");
    let headers = xemem.join("build/musl/kernel-headers");
    std::fs::create_dir_all(&headers).map_err(|e| e.to_string())?;
    let multiarch = Command::new("gcc").arg("-print-multiarch").output().map_err(|e| e.to_string())?;
    let multiarch = String::from_utf8_lossy(&multiarch.stdout).trim().to_string();
    for (link, target) in [
        ("linux", "/usr/include/linux".to_string()),
        ("asm", format!("/usr/include/{multiarch}/asm")),
        ("asm-generic", "/usr/include/asm-generic".to_string()),
    ] {
        let _ = std::fs::remove_file(headers.join(link));
        std::os::unix::fs::symlink(target, headers.join(link)).map_err(|e| e.to_string())?;
    }
    let cc = format!("musl-gcc -isystem {}", headers.display());
    let made = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&xemem)
        .arg(format!("CC={cc}"))
        .args(["BUILD=build/musl", "build/musl/lib/libxpmem.a"])
        .status()
        .map_err(|e| e.to_string())?;
    if !made.success() {
        return Err("building the musl libxpmem.a failed".into());
    }
    let built = Command::new("musl-gcc")
        .arg("-isystem")
        .arg(&headers)
        .args(["-static", "-O2"])
        .arg("-I")
        .arg(xemem.join("include"))
        .arg("-o")
        .arg(out)
        .arg(xemem.join("tests").join(source))
        .arg(xemem.join("build/musl/lib/libxpmem.a"))
        .status()
        .map_err(|e| e.to_string())?;
    if built.success() {
        Ok(())
    } else {
        Err("musl-gcc failed".into())
    }
}

/// The XEMEM ids the kernel of LWK enclave `enclave` has logged (oldest first: a new one after
/// each rejoin), asked of the daemon at `socket`.
pub fn lwk_xemem_ids(socket: &Path, enclave: &str) -> Vec<u32> {
    const LINE: &str = "[lwk] xemem: the name server gave this enclave id ";
    let logs = Client::connect_to(socket).unwrap().call(&json!({"op": "logs", "name": enclave})).unwrap();
    let lines = logs["lines"].as_array().cloned().unwrap_or_default();
    lines.iter().filter_map(Value::as_str).filter_map(|l| l.find(LINE).map(|at| l[at + LINE.len()..].trim().parse().unwrap())).collect()
}

/// Waits up to `timeout` for the kernel of LWK enclave `enclave` to log its first XEMEM id.
pub fn lwk_xemem_id(socket: &Path, enclave: &str, timeout: Duration) -> Option<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(&id) = lwk_xemem_ids(socket, enclave).first() {
            return Some(id);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the static binary `job` with `argv` (its first word included) in `enclave` of the
/// daemon at `socket`, in `cwd`, to its end; its stdout accumulates in `stdout` as it streams
/// (another thread may watch it). Returns the daemon's final reply.
pub fn run_job(socket: &Path, enclave: &str, job: &Path, argv: &[&str], cwd: &Path, stdout: &Mutex<String>) -> Value {
    let binary = File::open(job).unwrap();
    let directory = File::open(cwd).unwrap();
    let request = json!({"op": "run", "enclave": enclave, "argv": argv, "cwd": cwd.to_str().unwrap(), "files": []});
    Client::connect_to(socket)
        .unwrap()
        .call_streaming(&request, &[binary.as_raw_fd(), directory.as_raw_fd()], &mut |event| {
            if event["event"] == "output" && event["stream"] == "stdout" {
                stdout.lock().unwrap().push_str(event["text"].as_str().unwrap());
            }
        })
        .unwrap()
}

/// [`run_job`], its stdout returned with the reply.
pub fn run_job_to_end(socket: &Path, enclave: &str, job: &Path, argv: &[&str], cwd: &Path) -> (Value, String) {
    let stdout = Mutex::new(String::new());
    let reply = run_job(socket, enclave, job, argv, cwd, &stdout);
    (reply, stdout.into_inner().unwrap())
}
