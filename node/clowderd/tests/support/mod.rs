//! What the daemon's KVM tests share: where the kernel and the VMM are, whether enclaves can
//! run here and scratch directories (from clowder-test-support), LWK jobs and host programs
//! built from xemem/tests, an in-process daemon with its XEMEM broker, LWK enclaves and the
//! XEMEM ids they got, and mappings of an attach's memory.
#![allow(dead_code, unused_imports)] // each test crate uses its own part

pub mod hugepages;
pub mod processes;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use clowder_test_support::{kernel_image, vmm_binary, workspace_root, TempDir};
use clowder_test_support::{lwk_daemon, serve};
use clowderd::client::Client;
use clowderd::enclave::Liveness;
use clowderd::xemem::{FileRun, XememLinks};
use serde_json::{json, Value};

/// Why LWK enclaves cannot run here, if they cannot.
pub fn missing_requirement() -> Option<String> {
    clowder_test_support::why_enclaves_cannot_boot(&vmm_binary())
}

/// Why LWK jobs built with musl-gcc cannot run here, if they cannot.
pub fn missing_job_requirement() -> Option<String> {
    clowder_test_support::why_jobs_cannot_run(&vmm_binary())
}

/// Whether the test is skipped for `why` (a [`missing_requirement`] or a
/// [`missing_job_requirement`]), which is printed.
pub fn skipped(why: Option<String>) -> bool {
    if let Some(why) = &why {
        eprintln!("skipped: {why}");
    }
    why.is_some()
}

/// A scratch directory `name` for a test that runs LWK jobs, or `None` (the reason printed:
/// the test is skipped) where they cannot run.
pub fn job_test_dir(name: &str) -> Option<TempDir> {
    (!skipped(missing_job_requirement())).then(|| TempDir::new(name))
}

/// [`job_test_dir`] with the LWK job `job` and the host program `host` built in it.
pub fn job_test_programs(name: &str, job: &str, host: &str) -> Option<(TempDir, PathBuf, PathBuf)> {
    let dir = job_test_dir(name)?;
    let (job, host) = (lwk_job(&dir.0, job), host_program(&dir.0, host));
    Some((dir, job, host))
}

/// Runs `host_attacher` against the broker at `xemem_socket` while a job runs
/// `lwk_named_owner` in enclave `enclave_id`: it must find the job's segment, read its 16
/// pages, be refused a permit for another process, and write the 42 the job waits for.
/// `context` says what else to show when it did not.
pub fn assert_host_attacher_reads_the_job(attacher: &Path, xemem_socket: &Path, enclave_id: u32, context: impl Fn() -> String) {
    let host = Command::new(attacher).env("CLOWDER_XEMEM_SOCKET", xemem_socket).output().unwrap();
    let host_out = String::from_utf8_lossy(&host.stdout);
    let context = format!("host_attacher {:?}:\n{host_out}{}\n{}", host.status, String::from_utf8_lossy(&host.stderr), context());
    assert!(host.status.success(), "{context}");
    assert!(host_out.contains(&format!("found a segment of enclave {enclave_id}")), "{context}");
    assert!(host_out.contains("16 of 16 pages hold what the job wrote"), "{context}");
    assert!(host_out.contains("another process is refused the permit"), "{context}");
}

/// One request to the daemon at `socket`, and its reply.
pub fn call(socket: &Path, request: Value) -> Value {
    Client::connect_to(socket).unwrap().call(&request).unwrap()
}

/// Builds the host program `xemem/tests/<source>` against the host's libxpmem.a.
pub fn build_host_program(source: &str, out: &Path) {
    cc_against_libxpmem(&workspace_root().join("xemem/tests").join(source), out);
}

/// Compiles the C program `source` (which may include xemem/tests' headers) into `out`,
/// linked with the host's libxpmem.a (built first).
pub fn cc_against_libxpmem(source: &Path, out: &Path) {
    let xemem = workspace_root().join("xemem");
    assert!(Command::new("make").arg("-s").arg("-C").arg(&xemem).status().unwrap().success(), "make -C xemem");
    let built = Command::new("cc")
        .args(["-O2", "-I"])
        .arg(xemem.join("include"))
        .arg("-I")
        .arg(xemem.join("tests"))
        .arg("-o")
        .arg(out)
        .arg(source)
        .arg(xemem.join("build/lib/libxpmem.a"))
        .arg("-lpthread")
        .status()
        .unwrap();
    assert!(built.success(), "building {}", source.display());
}

/// `xemem/tests/<name>.c` built as a host program at `dir/<name>`.
pub fn host_program(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    build_host_program(&format!("{name}.c"), &out);
    out
}

/// `xemem/tests/<name>.c` built as a static musl LWK job at `dir/<name>`.
pub fn lwk_job(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    build_musl_job(&format!("{name}.c"), &out).unwrap_or_else(|e| panic!("building {name}.c: {e}"));
    out
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

/// Creates LWK enclave `name` (`cores` vCPUs, `mem` of RAM) on the daemon at `socket`; returns
/// the XEMEM id its kernel got.
pub fn create_lwk_enclave(socket: &Path, name: &str, cores: u32, mem: &str) -> u32 {
    let created = call(socket, json!({"op": "create", "name": name, "cores": cores, "mem": mem}));
    assert_eq!(created["ok"], true, "{created}");
    lwk_xemem_id(socket, name, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("enclave {name} got no XEMEM id: {}", call(socket, json!({"op": "logs", "name": name}))))
}

/// Removes the enclaves `names` of the daemon at `socket`.
pub fn remove_enclaves(socket: &Path, names: &[&str]) {
    for name in names {
        let removed = call(socket, json!({"op": "rm", "name": name}));
        assert_eq!(removed["ok"], true, "{removed}");
    }
}

/// The log lines of enclave `enclave` of the daemon at `socket`.
pub fn log_lines(socket: &Path, enclave: &str) -> Vec<String> {
    let logs = call(socket, json!({"op": "logs", "name": enclave}));
    logs["lines"].as_array().map(|lines| lines.iter().filter_map(|l| l.as_str().map(String::from)).collect()).unwrap_or_default()
}

/// Regions the daemon added to an enclave for host memory, and regions it removed again, as
/// the enclave's `log` says.
pub fn regions_added_and_removed(log: &[String]) -> (usize, usize) {
    let added = log.iter().filter(|l| l.contains("xemem: host memory (")).count();
    let removed = log.iter().filter(|l| l.contains("xemem: host memory region") && l.ends_with("removed")).count();
    (added, removed)
}

/// What a revocation run produced: a host owner (`host_revoking_owner`) removed or left a
/// segment an LWK job (`lwk_revoked_attacher`) had attached and was touching.
pub struct RevokeRun {
    pub job_status: Value,
    pub job_stdout: String,
    pub owner_status: Option<i32>,
    pub owner_stdout: String,
    /// The job's enclave's log.
    pub enclave_log: Vec<String>,
}

impl RevokeRun {
    /// All of it, for an assertion's message.
    pub fn context(&self) -> String {
        format!(
            "job {}:\n{}\nowner {:?}:\n{}\n{:#?}",
            self.job_status, self.job_stdout, self.owner_status, self.owner_stdout, self.enclave_log
        )
    }

    /// The owner removed its segment and kept its data; the job (`handler` mode) read the
    /// owner's pattern, its handler saw SIGBUS, and it detached and found its permit gone; the
    /// regions the attach added went again. `more` is shown beside [`RevokeRun::context`].
    pub fn assert_the_handler_saw_the_remove(&self, more: &str) {
        let context = format!("{}\n{more}", self.context());
        assert_eq!(self.job_status, 0, "{context}");
        assert!(self.job_stdout.contains("16 of 16 pages hold the owner's pattern"), "{context}");
        assert!(self.job_stdout.contains("main thread: SIGBUS inside the attachment: 1"), "{context}");
        assert!(self.job_stdout.contains("detach: 0"), "{context}");
        assert!(self.job_stdout.contains("release: -1 (errno 2)"), "{context}");
        assert_eq!(self.owner_status, Some(0), "{context}");
        assert!(self.owner_stdout.contains("remove: 0"), "{context}");
        assert!(self.owner_stdout.contains("owner data intact: 1"), "{context}");
        assert_regions_come_and_go(&self.enclave_log, &context);
    }
}

/// Every region the daemon added to an enclave for host memory was removed again (its log,
/// `log`, says), and there was one at least.
pub fn assert_regions_come_and_go(log: &[String], context: &str) {
    let (added, removed) = regions_added_and_removed(log);
    assert!(added >= 1 && added == removed, "regions added {added}, removed {removed}: {context}");
}

/// An in-process daemon serving under `dir`, with its XEMEM broker.
pub struct BrokeredDaemon {
    /// The daemon's API socket.
    pub socket: PathBuf,
    /// The broker's socket, for libxpmem's `CLOWDER_XEMEM_SOCKET`.
    pub xemem_socket: PathBuf,
    /// The daemon's XEMEM links (to look segments up, attach them, count what they served).
    pub links: Arc<XememLinks>,
}

/// Starts a [`BrokeredDaemon`] whose enclaves boot the built LWK.
pub fn start_daemon_with_broker(dir: &Path) -> BrokeredDaemon {
    let xemem_socket = dir.join("xemem.sock");
    // Pings get more time than the default 5 s: on a machine shared with other builds an
    // enclave's vCPU may be starved that long, and liveness is not what these tests test.
    let liveness = Liveness { ping_timeout: Duration::from_secs(20), ..Liveness::default() };
    let daemon = lwk_daemon(dir, vmm_binary(), liveness);
    let links = daemon.xemem_links().clone();
    assert!(daemon.host_xemem(clowderd::xemem::service::start(&xemem_socket).unwrap()).is_ok());
    BrokeredDaemon { socket: serve(daemon, dir), xemem_socket, links }
}

/// The memory of an attach answer's file runs, mapped shared and writable; unmapped when
/// dropped.
pub struct MappedRuns(Vec<(*mut libc::c_void, usize)>);

impl MappedRuns {
    /// Maps every run; panics at a hole.
    pub fn new(runs: &[FileRun]) -> MappedRuns {
        MappedRuns(
            runs.iter()
                .map(|run| {
                    let FileRun::Memory { file, offset, len } = run else { panic!("a hole in the segment's memory: {run:?}") };
                    // SAFETY: a fresh shared mapping of the memfd range the daemon handed out.
                    let view = unsafe {
                        libc::mmap(
                            std::ptr::null_mut(),
                            *len as usize,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED,
                            file.as_raw_fd(),
                            *offset as i64,
                        )
                    };
                    assert_ne!(view, libc::MAP_FAILED);
                    (view, *len as usize)
                })
                .collect(),
        )
    }

    /// The first word of every 4 KiB page, in the segment's order.
    pub fn first_words(&self) -> Vec<u64> {
        let pages = self.0.iter().flat_map(|&(view, len)| (0..len / 4096).map(move |page| view.cast::<u8>().wrapping_add(page * 4096)));
        // SAFETY: each page start lies inside one of the mappings this value holds.
        pages.map(|page| unsafe { std::ptr::read_volatile(page.cast::<u64>()) }).collect()
    }

    /// Writes `value` to word `word` of the first page.
    pub fn write_first_page(&self, word: usize, value: u64) {
        assert!(word < 512);
        // SAFETY: inside the first mapping, a page at least.
        unsafe { std::ptr::write_volatile(self.0[0].0.cast::<u64>().add(word), value) };
    }
}

impl Drop for MappedRuns {
    fn drop(&mut self) {
        for &(view, len) in &self.0 {
            // SAFETY: unmaps exactly a mapping made in `new`.
            unsafe { libc::munmap(view, len) };
        }
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
