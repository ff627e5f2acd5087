//! The persistent-enclave path end to end, against an in-process fake enclave: a thread that
//! plays the LWK's side of `enclave-proto` over a real `clowder-channel` ring pair in an
//! ordinary memfd. The daemon runs in the test's process with a launcher that makes fakes;
//! clients talk to it over its real socket. Shared by the `fake_enclave_*` tests, a file per
//! subject: jobs and the API, forwarded file calls, failures, XEMEM.
#![allow(dead_code)] // each test file uses its own part

mod kernel;

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clowder_channel::Channel;
use clowder_test_support::{daemon_config, serve, TempDir};
use clowderd::client::Client;
use clowderd::console::LogBook;
use clowderd::daemon::Daemon;
use clowderd::enclave::Liveness;
use clowderd::guest_ram::{GuestRam, RamRange};
use clowderd::machine::{ChannelParts, Launcher, Machine, MachineSpec, Populated, SharedRegion};
use clowderd::sys;
use serde_json::{json, Value};

use kernel::FakeKernel;

const RAM_SIZE: u64 = 4 << 20;
const CHANNEL_SIZE: u64 = 64 << 10;
const CHANNEL_GPA: u64 = RAM_SIZE - CHANNEL_SIZE;
/// Where the fake job keeps its I/O buffers.
const SCRATCH_GPA: u64 = 0x10000;
/// Where the fake kernel publishes one file slot (`FileSlots`: a control page and the slot).
const SLOTS_GPA: u64 = 0x2000;
/// Where the fake kernel keeps its count of page-table changes (`MappingCounter`).
const COUNTER_GPA: u64 = 0x8000;
const REGION_BASE: u64 = 1 << 32;
/// The fake job's exported memory (`xemem-owner`): virtual `SEGMENT_VADDR..` is RAM at
/// `SEGMENT_GPA..`, unless the fake kernel lies about its frames.
const SEGMENT_VADDR: u64 = 0x4000_0000;
const SEGMENT_GPA: u64 = 2 << 20;
pub const SEGMENT_PAGES: u64 = 16;

/// The fake kernels' clock origin (their XEMEM nodes count milliseconds from it).
static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// What the fake machine shares between its "hardware" (this struct) and its kernel thread.
pub struct FakeHardware {
    ram: GuestRam,
    /// Regions the daemon shared, by guest-physical base.
    regions: Mutex<HashMap<u64, File>>,
    ended: Mutex<Option<String>>,
    /// Set by the jobs `hang` and `corrupt`: the kernel stops answering pings.
    hung: AtomicBool,
    doorbell: File,
    /// How many attaches of its segments the fake kernel's node resolved.
    pub xemem_resolves: AtomicU32,
}

impl FakeHardware {
    /// What the fake kernel does to its published count when a job's memory is mapped anew.
    pub fn count_mapping_change(&self) {
        let mut word = [0u8; 8];
        self.ram.read(COUNTER_GPA, &mut word).unwrap();
        self.ram.write(COUNTER_GPA, &(u64::from_le_bytes(word) + 1).to_le_bytes()).unwrap();
    }
}

/// Every fake machine's hardware by enclave name, for tests that look inside one.
static MACHINES: std::sync::LazyLock<Mutex<HashMap<String, Arc<FakeHardware>>>> = std::sync::LazyLock::new(Mutex::default);

pub fn fake_hardware(enclave: &str) -> Arc<FakeHardware> {
    MACHINES.lock().unwrap().get(enclave).cloned().unwrap_or_else(|| panic!("no fake machine {enclave}"))
}

struct FakeMachine {
    hardware: Arc<FakeHardware>,
    memfd: File,
    interrupt: File,
    next_slot: u32,
    slots: HashMap<u32, u64>,
}

struct FakeLauncher;

impl Launcher for FakeLauncher {
    fn launch(&self, spec: &MachineSpec, log: Arc<LogBook>, _: &mut dyn FnMut(Populated)) -> Result<Box<dyn Machine>, String> {
        let memfd = sys::memfd("fake-enclave").map_err(|e| e.to_string())?;
        memfd.set_len(RAM_SIZE).map_err(|e| e.to_string())?;
        let ranges = vec![RamRange { gpa: 0, size: RAM_SIZE, file_offset: 0 }];
        // The fake's own view of its RAM; the channel is not reserved from the kernel's side.
        let ram = GuestRam::map(&memfd, ranges, (0, 0)).map_err(|e| e.to_string())?;
        let base = ram.host_address(CHANNEL_GPA, CHANNEL_SIZE).unwrap();
        // SAFETY: the region lies inside `ram`'s mapping, which the hardware keeps alive as long
        // as the kernel thread runs; nobody else touches it during init (the VMM's role).
        let channel = unsafe { Channel::init(base, CHANNEL_SIZE as usize) }.unwrap();
        let hardware = Arc::new(FakeHardware {
            ram,
            regions: Mutex::new(HashMap::new()),
            ended: Mutex::new(None),
            hung: AtomicBool::new(false),
            doorbell: sys::eventfd().unwrap(),
            xemem_resolves: AtomicU32::new(0),
        });
        MACHINES.lock().unwrap().insert(spec.name.clone(), hardware.clone());
        let kernel = FakeKernel::new(hardware.clone(), channel.guest_end().unwrap(), spec.cores.len() as u16);
        std::thread::spawn(move || kernel.run());
        log.push(format!("fake machine for {} started", spec.name));
        Ok(Box::new(FakeMachine { hardware, memfd, interrupt: sys::eventfd().unwrap(), next_slot: 10, slots: HashMap::new() }))
    }
}

impl Machine for FakeMachine {
    fn pid(&self) -> Option<u32> {
        None
    }

    fn channel(&mut self) -> Result<ChannelParts, String> {
        Ok(ChannelParts {
            memfd: self.memfd.try_clone().unwrap(),
            ram: vec![RamRange { gpa: 0, size: RAM_SIZE, file_offset: 0 }],
            channel_gpa: CHANNEL_GPA,
            channel_size: CHANNEL_SIZE,
            channel_offset: CHANNEL_GPA,
            doorbell: self.hardware.doorbell.try_clone().unwrap(),
            interrupt: self.interrupt.try_clone().unwrap(),
        })
    }

    fn add_region(&mut self, file: &File, len: u64) -> Result<SharedRegion, String> {
        assert_eq!(len % 4096, 0, "regions are page multiples");
        let slot = self.next_slot;
        self.next_slot += 1;
        let gpa = REGION_BASE + slot as u64 * (1 << 30);
        self.hardware.regions.lock().unwrap().insert(gpa, file.try_clone().unwrap());
        self.slots.insert(slot, gpa);
        Ok(SharedRegion { slot, gpa })
    }

    fn remove_region(&mut self, slot: u32) -> Result<(), String> {
        let gpa = self.slots.remove(&slot).ok_or("no such slot")?;
        self.hardware.regions.lock().unwrap().remove(&gpa);
        Ok(())
    }

    fn ended(&mut self) -> Option<String> {
        self.hardware.ended.lock().unwrap().clone()
    }

    fn shut_down(&mut self, _grace: Duration) -> String {
        self.hardware.ended.lock().unwrap().get_or_insert_with(|| "fake machine powered off".into()).clone()
    }
}

pub struct TestDaemon {
    pub socket: PathBuf,
    pub daemon: Arc<Daemon>,
    /// The jobs' binary: the fake enclaves never run it, but the daemon checks that an LWK
    /// could (a static x86-64 executable).
    pub program: PathBuf,
    _dir: TempDir,
}

pub fn start_daemon(label: &str, liveness: Liveness) -> TestDaemon {
    let dir = TempDir::new(&format!("clowderd-{label}"));
    let config = daemon_config(PathBuf::from("/nonexistent/clowder-vmm"), PathBuf::from("/nonexistent/lwk"), liveness);
    let daemon = Daemon::new(config, Box::new(FakeLauncher));
    let socket = serve(daemon.clone(), &dir.0);
    let program = dir.0.join("prog");
    std::fs::write(&program, static_executable_stub()).unwrap();
    TestDaemon { socket, daemon, program, _dir: dir }
}

/// A daemon for test `label` (`liveness`) with the one enclave `enclave`, and a scratch
/// directory for its jobs (`clowderd-LABEL-work`).
pub fn daemon_with_enclave(label: &str, liveness: Liveness, enclave: &str) -> (TestDaemon, TempDir) {
    let daemon = start_daemon(label, liveness);
    daemon.create(enclave);
    (daemon, TempDir::new(&format!("clowderd-{label}-work")))
}

/// A page holding the ELF header and one loadable segment of a static x86-64 executable
/// (nothing runs it).
fn static_executable_stub() -> Vec<u8> {
    let mut bytes = vec![0u8; 4096];
    bytes[..4].copy_from_slice(b"\x7fELF");
    bytes[4] = 2; // 64-bit
    bytes[5] = 1; // little-endian
    bytes[6] = 1; // version
    bytes[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    bytes[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    bytes[24..32].copy_from_slice(&0x40_0078u64.to_le_bytes()); // entry
    bytes[32..40].copy_from_slice(&64u64.to_le_bytes()); // program headers right after
    bytes[52..54].copy_from_slice(&64u16.to_le_bytes());
    bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
    bytes[56..58].copy_from_slice(&1u16.to_le_bytes());
    bytes[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    bytes[68..72].copy_from_slice(&5u32.to_le_bytes()); // R+X
    bytes[80..88].copy_from_slice(&0x40_0000u64.to_le_bytes()); // vaddr
    bytes[96..104].copy_from_slice(&4096u64.to_le_bytes()); // file size
    bytes[104..112].copy_from_slice(&4096u64.to_le_bytes()); // memory size
    bytes
}

/// Short enough that a hang is seen within seconds, long enough that a loaded two-core machine
/// (a parallel build beside the tests) does not make a healthy fake kernel miss its Ping: at
/// 400 ms, a crashing enclave was sometimes reported hung first, and the survivor's run failed.
pub fn quick_liveness() -> Liveness {
    Liveness { hello_timeout: Duration::from_secs(5), ping_interval: Duration::from_millis(100), ping_timeout: Duration::from_secs(2) }
}

impl TestDaemon {
    pub fn client(&self) -> Client {
        Client::connect_to(&self.socket).unwrap()
    }

    pub fn call(&self, request: Value) -> Value {
        self.client().call(&request).unwrap()
    }

    pub fn create(&self, name: &str) {
        let reply = self.call(json!({"op": "create", "name": name, "cores": 1, "mem": "16M"}));
        assert_eq!(reply["ok"], true, "{reply}");
    }

    /// Runs a job in `enclave` from directory `cwd`; returns (final reply, stdout, stderr).
    pub fn run(&self, enclave: &str, argv: &[&str], cwd: &Path, inputs: &[(&str, &Path)]) -> (Value, String, String) {
        self.run_program(&self.program, enclave, argv, cwd, inputs, None)
    }

    /// `run` with another program file, confined to `confine` if given.
    pub fn run_program(
        &self,
        program: &Path,
        enclave: &str,
        argv: &[&str],
        cwd: &Path,
        inputs: &[(&str, &Path)],
        confine: Option<&Path>,
    ) -> (Value, String, String) {
        let binary = File::open(program).unwrap();
        let dir = File::open(cwd).unwrap();
        let input_files: Vec<File> = inputs.iter().map(|(_, path)| File::open(path).unwrap()).collect();
        let mut fds = vec![binary.as_raw_fd(), dir.as_raw_fd()];
        fds.extend(input_files.iter().map(|f| f.as_raw_fd()));
        let mut request = json!({
            "op": "run", "enclave": enclave, "argv": argv, "cwd": cwd.to_str().unwrap(),
            "files": inputs.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        });
        if let Some(dir) = confine {
            request["confine"] = json!(dir.to_str().unwrap());
        }
        let (mut stdout, mut stderr) = (String::new(), String::new());
        let reply = self
            .client()
            .call_streaming(&request, &fds, &mut |event| {
                if event["event"] == "output" {
                    let text = event["text"].as_str().unwrap();
                    if event["stream"] == "stderr" {
                        stderr.push_str(text)
                    } else {
                        stdout.push_str(text)
                    }
                }
            })
            .unwrap();
        (reply, stdout, stderr)
    }

    pub fn wait_until_removed(&self, name: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let list = self.call(json!({"op": "ls"}));
            let removed = list["removed"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned();
            let present = list["enclaves"].as_array().unwrap().iter().any(|e| e["name"] == name);
            if let (Some(removed), false) = (removed, present) {
                return removed["reason"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "enclave {name} was not removed: {list}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
