//! Shared by the `guest_*.rs` integration tests: builds `kernels/testguest`, boots it under
//! /dev/kvm with the vmm library, and collects what it reported (`kernels/testguest/README.md`
//! says what each test reports).

#![allow(dead_code)] // each test binary uses a different part of this module

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clowder_channel::{Endpoint, SendError};
use vmm::devices::Report;
use vmm::{ExtraDevice, StopReason, Vm, VmConfig, VmHandle};

/// Skips the calling test, with a reason on stderr, when this machine has no /dev/kvm.
#[macro_export]
macro_rules! require_kvm {
    () => {
        if !std::path::Path::new("/dev/kvm").exists() {
            eprintln!("skipped: /dev/kvm is absent on this machine");
            return;
        }
    };
}

/// How long any one guest may run before a test gives up on it.
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends `message` on the host's end of a channel, sleeping while the ring is full; panics if
/// the guest has not drained it within `timeout`, or on any other send error. The caller rings
/// the guest if it sleeps.
pub fn send_within(endpoint: &mut Endpoint, message: &[u8], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let sent = endpoint.send_waiting(message, || {
        std::thread::sleep(Duration::from_micros(100));
        Instant::now() < deadline
    });
    assert_ne!(sent, Err(SendError::Full), "the guest stopped draining its ring");
    sent.unwrap_or_else(|e| panic!("send: {e}"));
}

/// Receives the next message on the host's end of a channel, calling `idle` (which may sleep)
/// while the ring is empty; panics after `timeout`.
pub fn recv_within(endpoint: &mut Endpoint, timeout: Duration, mut idle: impl FnMut(&mut Endpoint)) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    let mut buffer = [0u8; 256];
    loop {
        if let Some(length) = endpoint.recv(&mut buffer).expect("a well-formed ring") {
            return buffer[..length].to_vec();
        }
        assert!(Instant::now() < deadline, "no reply from the guest within {timeout:?}");
        idle(endpoint);
    }
}

/// Sleeps (up to `timeout`) on the doorbell eventfd `doorbell` as the guest expects: announce
/// it, re-check for a message sent meanwhile, and only then block. Returns the doorbell's count.
pub fn sleep_announced(endpoint: &mut Endpoint, doorbell: RawFd, timeout: Duration) -> u64 {
    endpoint.set_waiting(true);
    let count = if endpoint.has_message().unwrap() { 0 } else { eventfd_count_within(doorbell, timeout) };
    endpoint.set_waiting(false);
    count
}

/// Waits up to `timeout` for the eventfd `fd` to fire; returns (consuming) its count, 0 if it
/// did not.
pub fn eventfd_count_within(fd: RawFd, timeout: Duration) -> u64 {
    let mut poll_fd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut poll_fd, 1, timeout.as_millis() as i32) } <= 0 {
        return 0;
    }
    let mut count = 0u64;
    // SAFETY: reads at most 8 bytes into a u64 we own; an eventfd reads exactly 8.
    let read = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
    if read == 8 {
        count
    } else {
        0
    }
}

/// The test guest image: `$CLOWDER_TESTGUEST` if set, else built (once per test binary) with
/// `kernels/build.sh testguest`, which is a no-op when the image is up to date.
pub fn testguest() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        if let Some(path) = std::env::var_os("CLOWDER_TESTGUEST") {
            return PathBuf::from(path);
        }
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let script = repository.join("kernels/build.sh");
        let output = Command::new(&script).arg("testguest").output().unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(output.status.success(), "kernels/build.sh testguest failed:\n{}", String::from_utf8_lossy(&output.stderr));
        let path = String::from_utf8(output.stdout).unwrap().lines().last().unwrap().trim().to_string();
        PathBuf::from(path)
    })
}

/// A directory of its own under the system temp dir, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(label: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!("clowder-{label}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What to boot. The devices are always COM1 (to a file), exit, hypercall and a channel, plus
/// `extra_devices_toml` (`[[device]]` tables).
pub struct GuestSpec {
    pub cmdline: String,
    pub protocol: &'static str,
    pub smp: &'static str,
    pub cpus: usize,
    pub memory: &'static str,
    pub watchdog: &'static str,
    pub modules: Vec<PathBuf>,
    pub extra_devices_toml: String,
    /// Host core of each vCPU; empty: unpinned.
    pub cores: Vec<usize>,
}

impl GuestSpec {
    pub fn new(cmdline: &str) -> GuestSpec {
        GuestSpec {
            cmdline: cmdline.to_string(),
            protocol: "pvh",
            smp: "direct",
            cpus: 1,
            memory: "64M",
            watchdog: "30s",
            modules: Vec::new(),
            extra_devices_toml: String::new(),
            cores: Vec::new(),
        }
    }

    pub fn protocol(mut self, protocol: &'static str) -> Self {
        self.protocol = protocol;
        self
    }

    pub fn smp(mut self, smp: &'static str) -> Self {
        self.smp = smp;
        self
    }

    pub fn cpus(mut self, cpus: usize) -> Self {
        self.cpus = cpus;
        self
    }

    pub fn cores(mut self, cores: &[usize]) -> Self {
        self.cores = cores.to_vec();
        self
    }

    pub fn watchdog(mut self, watchdog: &'static str) -> Self {
        self.watchdog = watchdog;
        self
    }

    pub fn module(mut self, path: PathBuf) -> Self {
        self.modules.push(path);
        self
    }

    pub fn devices(mut self, toml: &str) -> Self {
        self.extra_devices_toml.push_str(toml);
        self
    }

    pub fn config(&self, scratch: &Scratch) -> VmConfig {
        let modules: Vec<String> = self.modules.iter().map(|m| format!("{:?}", m.display().to_string())).collect();
        let text = format!(
            r#"
[memory]
size = "{memory}"
[cpus]
count = {cpus}
{cores}
[boot]
kernel = {kernel:?}
cmdline = {cmdline:?}
modules = [{modules}]
protocol = "{protocol}"
smp = "{smp}"
[watchdog]
timeout = "{watchdog}"

[[device]]
name = "com1"
kind = "serial"
output = "file:serial.log"
[[device]]
kind = "exit"
[[device]]
kind = "hypercall"
[[device]]
kind = "channel"
{extra}
"#,
            memory = self.memory,
            cpus = self.cpus,
            cores = if self.cores.is_empty() { String::new() } else { format!("cores = {:?}", self.cores) },
            kernel = testguest().display().to_string(),
            cmdline = self.cmdline,
            modules = modules.join(", "),
            protocol = self.protocol,
            smp = self.smp,
            watchdog = self.watchdog,
            extra = self.extra_devices_toml,
        );
        VmConfig::from_toml_str(&text, scratch.path()).unwrap_or_else(|e| panic!("config: {e}\n{text}"))
    }
}

/// A started test guest.
pub struct Guest {
    pub vm: Vm,
    pub handle: Arc<VmHandle>,
    scratch: Scratch,
}

/// What a finished guest left behind.
#[derive(Debug)]
pub struct Finished {
    pub stop: StopReason,
    pub reports: Vec<Report>,
    pub serial: String,
    pub exit_counters: Vec<(&'static str, u64)>,
}

impl Guest {
    pub fn start(spec: GuestSpec) -> Guest {
        Guest::start_with(spec, Vec::new())
    }

    pub fn start_with(spec: GuestSpec, extra: Vec<ExtraDevice>) -> Guest {
        let scratch = Scratch::new("guest");
        let config = spec.config(&scratch);
        let mut vm = Vm::with_devices(config, extra).unwrap_or_else(|e| panic!("creating the VM: {e}"));
        let handle = vm.handle();
        vm.start().unwrap_or_else(|e| panic!("starting the VM: {e}"));
        Guest { vm, handle, scratch }
    }

    pub fn serial(&self) -> String {
        std::fs::read_to_string(self.scratch.path().join("serial.log")).unwrap_or_default()
    }

    /// Waits for the guest to stop (at most `GUEST_TIMEOUT`, then stops it and fails).
    pub fn finish(mut self) -> Finished {
        let stop = match self.vm.wait_timeout(GUEST_TIMEOUT) {
            Some(stop) => stop,
            None => {
                self.vm.stop();
                panic!("guest still running after {GUEST_TIMEOUT:?}; serial so far:\n{}", self.serial());
            }
        };
        Finished { stop, reports: self.handle.reports(), serial: self.serial(), exit_counters: self.handle.exit_counters() }
    }

    /// Waits until the guest has made a report with `key`; returns its value.
    pub fn wait_for_report(&self, key: &str) -> u64 {
        let deadline = std::time::Instant::now() + GUEST_TIMEOUT;
        loop {
            if let Some(report) = self.handle.reports().iter().find(|r| r.key == pack_key(key)) {
                return report.value;
            }
            assert!(std::time::Instant::now() < deadline, "no {key:?} report after {GUEST_TIMEOUT:?}; serial:\n{}", self.serial());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Boots `spec` and waits for the guest to stop.
pub fn run(spec: GuestSpec) -> Finished {
    Guest::start(spec).finish()
}

/// A report key as the guest packs it: up to 8 ASCII bytes, little-endian.
pub fn pack_key(name: &str) -> u64 {
    assert!(name.len() <= 8, "report keys have at most 8 bytes");
    let mut bytes = [0u8; 8];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    u64::from_le_bytes(bytes)
}

pub fn unpack_key(key: u64) -> String {
    let bytes = key.to_le_bytes();
    let length = bytes.iter().position(|&b| b == 0).unwrap_or(8);
    String::from_utf8_lossy(&bytes[..length]).into_owned()
}

impl Finished {
    /// Every value reported under `key`, in order.
    pub fn values(&self, key: &str) -> Vec<u64> {
        self.reports.iter().filter(|r| r.key == pack_key(key)).map(|r| r.value).collect()
    }

    /// The one value reported under `key`.
    pub fn value(&self, key: &str) -> u64 {
        match self.values(key).as_slice() {
            [value] => *value,
            other => panic!("expected one {key:?} report, got {other:?}\n{self}"),
        }
    }

    pub fn exit_count(&self, kind: &str) -> u64 {
        self.exit_counters.iter().find(|(name, _)| *name == kind).map(|(_, n)| *n).unwrap_or(0)
    }

    /// Asserts the guest exited through the exit port with `status`.
    pub fn assert_exit(&self, status: u8) {
        assert_eq!(self.stop, StopReason::GuestExit(status), "{self}");
    }
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "stop: {}", self.stop)?;
        writeln!(f, "reports:")?;
        for r in &self.reports {
            writeln!(f, "  vcpu {} {} = {:#x}", r.vcpu, unpack_key(r.key), r.value)?;
        }
        write!(f, "serial:\n{}", self.serial)
    }
}
