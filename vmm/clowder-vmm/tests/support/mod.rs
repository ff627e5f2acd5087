//! Shared by the `clowder-vmm` process tests: starts the binary as a child process on the test
//! guest, waits for it with a deadline, and talks to its control socket from this (another)
//! process. The test guest is found or built by the vmm crate's own test support, included here
//! rather than copied.

#![allow(dead_code)] // each test binary uses a different part of this module

#[macro_use]
#[path = "../../../core/tests/guest_support/mod.rs"]
pub mod guest_support;
pub mod bzimage;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vmm::control::ControlClient;

pub use guest_support::{testguest, Scratch};

/// The binary under test.
pub const CLOWDER_VMM: &str = env!("CARGO_BIN_EXE_clowder-vmm");

/// Guest RAM of the test VMs: room for the test guest, a module and the channel, and small
/// enough that preallocating it costs little.
pub const GUEST_MEMORY: &str = "16M";
pub const GUEST_MEMORY_BYTES: u64 = 16 << 20;
/// The channel device's default size (vmm-config README).
pub const CHANNEL_SIZE: u64 = 64 << 10;

/// A test-guest command line that makes nop hypercalls until the VM is stopped: each one is an
/// exit the counters see, so progress is observable from outside.
pub const ENDLESS_NOPS: &str = "test=nop-loop count=100000000000";

/// How long a VMM process may take to do what a test waits for before the test gives up (the
/// guests here finish in milliseconds; this only bounds a broken run).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `condition` every millisecond until it holds; panics with `what` after `DEADLINE`.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {DEADLINE:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A `clowder-vmm` command line being put together. Serial output goes to `serial.log` and the
/// control socket to `control.sock`, both in a scratch directory of the launch's own.
pub struct Launch {
    scratch: Scratch,
    args: Vec<String>,
    serial: String,
}

impl Launch {
    /// The test guest, entered through PVH, running `cmdline` (`test=...`).
    pub fn testguest(cmdline: &str) -> Launch {
        Launch::kernel(testguest(), cmdline)
    }

    pub fn kernel(kernel: &Path, cmdline: &str) -> Launch {
        let scratch = Scratch::new("vmm-process");
        let serial = format!("file:{}", scratch.path().join("serial.log").display());
        let args = vec![
            "--kernel".into(),
            kernel.display().to_string(),
            "--mem".into(),
            GUEST_MEMORY.into(),
            "--cmdline".into(),
            cmdline.into(),
            "--control".into(),
            scratch.path().join("control.sock").display().to_string(),
        ];
        Launch { scratch, args, serial }
    }

    /// Adds `flag value` (flags other than `--module` may appear once).
    pub fn arg(mut self, flag: &str, value: impl AsRef<str>) -> Launch {
        self.args.push(flag.into());
        self.args.push(value.as_ref().into());
        self
    }

    /// Replaces the serial output (`--serial`).
    pub fn serial(mut self, output: impl Into<String>) -> Launch {
        self.serial = output.into();
        self
    }

    /// The scratch directory the process's files go to (to place inputs there beforehand).
    pub fn scratch_path(&self) -> &Path {
        self.scratch.path()
    }

    pub fn start(self) -> VmmProcess {
        let stdout = File::create(self.scratch.path().join("stdout.log")).unwrap();
        let stderr = File::create(self.scratch.path().join("stderr.log")).unwrap();
        let child = Command::new(CLOWDER_VMM)
            .args(&self.args)
            .arg("--serial")
            .arg(&self.serial)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {CLOWDER_VMM}: {e}"));
        VmmProcess { child: Some(child), scratch: self.scratch, args: self.args }
    }

    /// [`Launch::start`], connected to the control socket.
    pub fn start_controlled(self) -> (VmmProcess, Control) {
        let mut vmm = self.start();
        let control = vmm.control();
        (vmm, control)
    }
}

/// A running `clowder-vmm`; killed if a test lets go of it while it still runs.
pub struct VmmProcess {
    child: Option<Child>,
    scratch: Scratch,
    args: Vec<String>,
}

/// How a `clowder-vmm` process ended, and what it left behind.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    pub stderr: String,
    pub stdout: String,
    pub serial: String,
}

impl Ended {
    /// The exit code; a death by signal fails the test (the VMM handles the ones it is sent).
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or_else(|| panic!("clowder-vmm was killed by signal {:?}\n{self}", self.status.signal()))
    }

    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    /// A failure must be reported, never a Rust panic.
    pub fn assert_no_panic(&self) {
        assert!(!self.stderr.contains("panicked"), "clowder-vmm panicked\n{self}");
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status: {}\nstderr:\n{}\nstdout:\n{}\nserial:\n{}", self.status, self.stderr, self.stdout, self.serial)
    }
}

impl VmmProcess {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn control_path(&self) -> PathBuf {
        self.scratch.path().join("control.sock")
    }

    pub fn scratch_path(&self) -> &Path {
        self.scratch.path()
    }

    pub fn serial(&self) -> String {
        std::fs::read_to_string(self.scratch.path().join("serial.log")).unwrap_or_default()
    }

    fn read_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.scratch.path().join(name)).unwrap_or_default()
    }

    /// Connects to the control socket once the VMM has created it.
    pub fn control(&mut self) -> Control {
        let path = self.control_path();
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Ok(client) = ControlClient::connect(&path) {
                return Control(client);
            }
            if let Ok(Some(status)) = self.child.as_mut().expect("running").try_wait() {
                panic!(
                    "clowder-vmm {:?} exited with {status} before its control socket appeared\nstderr:\n{}",
                    self.args,
                    self.read_log("stderr.log")
                );
            }
            assert!(Instant::now() < deadline, "no control socket at {} after {DEADLINE:?}", path.display());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits for the process to end (at most `DEADLINE`, then kills it and fails).
    pub fn wait(mut self) -> Ended {
        let mut child = self.child.take().expect("waited once");
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "clowder-vmm {:?} still running after {DEADLINE:?}\nstderr:\n{}\nserial:\n{}",
                    self.args,
                    self.read_log("stderr.log"),
                    self.serial()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        Ended { status, stderr: self.read_log("stderr.log"), stdout: self.read_log("stdout.log"), serial: self.serial() }
    }
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `clowder-vmm` with exactly `args` (no defaults added) and waits for it.
pub fn run_with_args(args: &[&str]) -> Ended {
    let scratch = Scratch::new("vmm-args");
    let output = Command::new(CLOWDER_VMM)
        .args(args)
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {CLOWDER_VMM}: {e}"));
    Ended {
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        serial: String::new(),
    }
}

/// The control socket, as another process sees it.
pub struct Control(pub ControlClient);

impl Control {
    /// Sends `request` with `fds`; returns the reply and the descriptors that came with it.
    pub fn call_with_fds(&mut self, request: Value, fds: &[RawFd]) -> (Value, Vec<File>) {
        self.0.call(&request, fds).unwrap_or_else(|e| panic!("control request {request}: {e}"))
    }

    pub fn call(&mut self, request: Value) -> Value {
        let (reply, files) = self.call_with_fds(request.clone(), &[]);
        assert!(files.is_empty(), "{request} came back with {} descriptors", files.len());
        reply
    }

    /// A request that must succeed.
    pub fn call_ok(&mut self, request: Value) -> Value {
        let reply = self.call(request.clone());
        assert_eq!(reply["ok"], true, "{request} failed: {reply}");
        reply
    }

    /// The `stats` reply.
    pub fn stats(&mut self) -> Value {
        self.call_ok(serde_json::json!({"op": "stats"}))
    }

    /// One exit counter from `stats`.
    pub fn exits(&mut self, kind: &str) -> u64 {
        let stats = self.stats();
        stats["exits"][kind].as_u64().unwrap_or_else(|| panic!("no {kind:?} counter in {stats}"))
    }
}

/// A memfd mapped shared into this process (read-write), unmapped on drop.
pub struct SharedMapping {
    address: *mut u8,
    len: usize,
}

impl SharedMapping {
    /// Maps `len` bytes of `fd` from `offset` (page aligned).
    pub fn map(fd: RawFd, offset: u64, len: usize) -> SharedMapping {
        // SAFETY: a fresh shared mapping of a file descriptor we hold; checked for failure.
        let address = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, offset as libc::off_t)
        };
        assert_ne!(address, libc::MAP_FAILED, "mmap of fd {fd} at {offset:#x}: {}", std::io::Error::last_os_error());
        SharedMapping { address: address.cast(), len }
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.address
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn read_u64(&self, index: usize) -> u64 {
        assert!((index + 1) * 8 <= self.len);
        // SAFETY: in bounds of the mapping; the other side may write concurrently, hence volatile.
        unsafe { self.address.cast::<u64>().add(index).read_volatile() }
    }

    pub fn write_u64(&self, index: usize, value: u64) {
        assert!((index + 1) * 8 <= self.len);
        // SAFETY: as for `read_u64`.
        unsafe { self.address.cast::<u64>().add(index).write_volatile(value) }
    }

    pub fn bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.len);
        // SAFETY: in bounds of the mapping.
        unsafe { std::slice::from_raw_parts(self.address.add(offset), len) }.to_vec()
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.address.cast(), self.len) };
    }
}

/// A new, zero-filled memfd of `len` bytes.
pub fn memfd(name: &std::ffi::CStr, len: usize) -> OwnedFd {
    // SAFETY: plain syscalls; results checked.
    unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0, "ftruncate");
        fd
    }
}

/// (device, inode) of an open file: two descriptors with the same identity are the same file,
/// even when they came from different processes.
pub fn file_identity(fd: RawFd) -> (u64, u64) {
    // SAFETY: fstat into a zeroed struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `stat`.
    assert_eq!(unsafe { libc::fstat(fd, &mut stat) }, 0, "fstat");
    (stat.st_dev, stat.st_ino)
}
