//! The machine behind an enclave. The daemon talks to it through [`Machine`]: get the channel,
//! share memory regions, notice that it ended, shut it down. [`VmmLauncher`] starts one
//! `clowder-vmm` process per enclave and drives it through its control socket; tests plug in an
//! in-process fake.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clowder_api::vmm::{AddPieces, AddRegion, ChannelReply, MemoryReply, Region, VmmRequest};
use vmm::control::ControlClient;
use vmm::memory::POPULATE_PROGRESS;
pub use vmm::RegionAccess;

use crate::console::{ConsoleSplitter, LogBook, Piece};
use crate::guest_ram::RamRange;
use crate::memory::{format_size, parse_size};
use crate::sys;

/// Everything the host end of the channel needs.
pub struct ChannelParts {
    pub memfd: File,
    pub ram: Vec<RamRange>,
    pub channel_gpa: u64,
    pub channel_size: u64,
    /// Where the channel lives in the memfd.
    pub channel_offset: u64,
    /// Signalled by the guest's doorbell (guest → host).
    pub doorbell: File,
    /// Raises the channel interrupt in the guest (host → guest).
    pub interrupt: File,
}

/// A memory region shared into the enclave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedRegion {
    pub slot: u32,
    pub gpa: u64,
}

pub struct MachineSpec {
    pub name: String,
    pub cores: Vec<usize>,
    pub memory: u64,
    pub hugepages: bool,
    /// The block of thread and process ids an LWK numbers from (`lwk.id_block`).
    pub id_block: u64,
}

pub trait Machine: Send {
    /// The host process that runs the enclave, when there is one.
    fn pid(&self) -> Option<u32>;
    fn channel(&mut self) -> Result<ChannelParts, String>;
    /// Makes the first `len` bytes of `file` (a memfd, page-multiple length) visible to the
    /// enclave as a new guest-physical region.
    fn add_region(&mut self, file: &File, len: u64) -> Result<SharedRegion, String>;
    fn remove_region(&mut self, slot: u32) -> Result<(), String>;
    /// Makes `[offset, offset + len)` of `file` a new guest-physical region (XEMEM attaches of
    /// host memory: a range of the owner's memfd; read-only for another kernel's published
    /// words). Machines without run-time regions refuse.
    fn add_region_range(&mut self, _file: &File, _offset: u64, _len: u64, _access: RegionAccess) -> Result<SharedRegion, String> {
        Err("this machine cannot add memory regions at run time".into())
    }
    /// Makes `pieces` of `file`, end to end, ONE new guest-physical region (an owner's
    /// scattered frames in one memory slot, not a slot each). `None`: this machine cannot.
    fn add_region_pieces(&mut self, _file: &File, _pieces: &[clowder_api::vmm::Piece]) -> Option<Result<SharedRegion, String>> {
        None
    }
    /// Without blocking: how the machine ended, once it has.
    fn ended(&mut self) -> Option<String>;
    /// Stops the machine (politely, then by force after `grace`) and says how it ended.
    fn shut_down(&mut self, grace: Duration) -> String;
}

pub trait Launcher: Send + Sync {
    /// Starts a machine; its console and diagnostics go to `log`. `progress` hears how far
    /// populating the machine's memory got while that takes long (a machine may say nothing).
    fn launch(&self, spec: &MachineSpec, log: Arc<LogBook>, progress: &mut dyn FnMut(Populated)) -> Result<Box<dyn Machine>, String>;
    /// Starts a Linux virtual machine booting `guest` (`linux_enclave`).
    fn launch_linux(
        &self,
        _spec: &MachineSpec,
        _guest: &crate::linux_enclave::LinuxGuest,
        _log: Arc<LogBook>,
        _progress: &mut dyn FnMut(Populated),
    ) -> Result<Box<dyn Machine>, String> {
        Err("this clowderd cannot start Linux enclaves".into())
    }
    /// Where a Linux enclave's VMM serves its XEMEM device, and its control socket
    /// (`xemem::vm`); `None` where Linux machines have no such device.
    fn linux_xemem(&self, _name: &str) -> Option<crate::xemem::vm::VmSockets> {
        None
    }
}

/// One of the VMM's reports of guest RAM populated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Populated {
    pub done_mib: u64,
    pub total_mib: u64,
    pub elapsed_ms: u64,
}

impl Populated {
    /// Reads a report as the VMM words it after [`POPULATE_PROGRESS`]: `N of M MiB in T s`.
    pub fn parse(report: &str) -> Option<Populated> {
        let (done, rest) = report.split_once(" of ")?;
        let (total, rest) = rest.split_once(" MiB in ")?;
        let seconds: f64 = rest.strip_suffix(" s")?.parse().ok()?;
        Some(Populated { done_mib: done.parse().ok()?, total_mib: total.parse().ok()?, elapsed_ms: (seconds * 1000.0).round() as u64 })
    }
}

/// What a `clowder-vmm` exit status means (its README's table, plus the LWK's panic status).
pub fn describe_vmm_exit(status: ExitStatus) -> String {
    if let Some(signal) = status.signal() {
        return format!("clowder-vmm was killed by signal {signal} ({})", signal_name(signal));
    }
    match status.code().unwrap_or(-1) {
        0 => "clowder-vmm exited normally".into(),
        2 => "clowder-vmm could not set up the VM (status 2)".into(),
        124 => "the guest stopped responding (VMM watchdog, status 124)".into(),
        125 => "the guest triple-faulted (status 125)".into(),
        126 => "the guest did something the VMM does not handle (status 126)".into(),
        127 => "KVM failed inside the VMM (status 127)".into(),
        254 => "the LWK panicked (status 254)".into(),
        // clowder-vmm's own convention for a VM it tore down on a signal.
        code @ 129..=159 => format!("clowder-vmm stopped on signal {} ({})", code - 128, signal_name(code - 128)),
        code => format!("clowder-vmm exited with status {code}"),
    }
}

pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        _ => "signal",
    }
}

/// The `clowder-vmm` command line for an LWK enclave.
pub fn vmm_command(vmm: &Path, kernel: &Path, spec: &MachineSpec) -> Command {
    let mut command = Command::new(vmm);
    // The machine stops if the daemon dies, however it dies (clowder-vmm watches its parent).
    command.env("CLOWDER_VMM_PARENT", std::process::id().to_string());
    command
        .arg("--kernel")
        .arg(kernel)
        .arg("--mem")
        .arg(format_size(spec.memory))
        .arg("--cpus")
        .arg(spec.cores.len().to_string())
        .arg("--cores")
        .arg(spec.cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","));
    if spec.hugepages {
        command.arg("--backing").arg("2m");
    }
    command
}

/// Starts persistent LWK enclaves as `clowder-vmm` processes with a control socket.
pub struct VmmLauncher {
    pub vmm: PathBuf,
    pub kernel: PathBuf,
    /// Where control sockets go.
    pub runtime_dir: PathBuf,
}

struct VmmMachine {
    child: Child,
    control: ControlClient,
    control_path: PathBuf,
    ended: Option<String>,
}

/// How long a VMM may be silent while it starts: before its first word, and between its
/// reports of guest RAM populated.
pub const STARTUP_SILENCE: Duration = Duration::from_secs(10);
/// What the first window allows for populating each GiB of guest RAM, beyond
/// [`STARTUP_SILENCE`] (populating a GiB of 4 KiB pages took 2-8 s on a loaded 2-core VM).
pub const STARTUP_PER_GIB: Duration = Duration::from_secs(10);

/// When a VMM starting a machine of `memory` bytes at `started` has taken too long to open its
/// control socket: never while it keeps reporting progress. A larger machine gets a longer
/// first window, and each report of populated RAM (`last_progress`) gives it
/// [`STARTUP_SILENCE`] more from then.
pub fn startup_deadline(started: Instant, memory: u64, last_progress: Option<Instant>) -> Instant {
    let gib = memory.div_ceil(1 << 30) as u32;
    let first = started + STARTUP_SILENCE + STARTUP_PER_GIB * gib;
    last_progress.map_or(first, |at| first.max(at + STARTUP_SILENCE))
}

/// The guest RAM size a `clowder-vmm` command line asks for (`--mem`; the VMM's default
/// otherwise).
fn memory_of(command: &Command) -> u64 {
    let mut args = command.get_args();
    while let Some(arg) = args.next() {
        if arg == "--mem" {
            return args.next().and_then(|size| parse_size(&size.to_string_lossy()).ok()).unwrap_or(0);
        }
    }
    64 << 20
}

/// The VMM's last report of guest RAM populated, and when it came.
type Progress = Arc<Mutex<Option<(Instant, String)>>>;

/// Copies a process's console into the log book, kernel lines and job output alike; reports of
/// populated guest RAM also go to `progress`.
fn follow_console(source: impl std::io::Read + Send + 'static, log: Arc<LogBook>, label: &'static str, progress: Option<Progress>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut splitter = ConsoleSplitter::default();
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            for piece in splitter.push(&line) {
                match piece {
                    Piece::KernelLine(text) => log.push(format!("[lwk] {text}")),
                    Piece::Output(bytes) => {
                        let text = String::from_utf8_lossy(&bytes).trim_end().to_string();
                        if let (Some(progress), Some(report)) = (&progress, text.strip_prefix(POPULATE_PROGRESS)) {
                            *progress.lock().unwrap() = Some((Instant::now(), report.to_string()));
                        }
                        log.push(format!("{label}{text}"));
                    }
                }
            }
            line.clear();
        }
    });
}

impl Launcher for VmmLauncher {
    fn launch(&self, spec: &MachineSpec, log: Arc<LogBook>, progress: &mut dyn FnMut(Populated)) -> Result<Box<dyn Machine>, String> {
        let control_path = self.runtime_dir.join(format!("{}.vmm.sock", spec.name));
        log.push(format!("clowderd: starting clowder-vmm for enclave {}", spec.name));
        let mut command = vmm_command(&self.vmm, &self.kernel, spec);
        command.arg("--cmdline").arg(format!("lwk.id_block={}", spec.id_block));
        start_vmm_reporting(command, control_path, log, progress)
    }

    fn launch_linux(
        &self,
        spec: &MachineSpec,
        guest: &crate::linux_enclave::LinuxGuest,
        log: Arc<LogBook>,
        progress: &mut dyn FnMut(Populated),
    ) -> Result<Box<dyn Machine>, String> {
        crate::linux_enclave::launch_vmm(self, spec, guest, log, progress)
    }

    fn linux_xemem(&self, name: &str) -> Option<crate::xemem::vm::VmSockets> {
        Some(crate::linux_enclave::xemem_sockets(&self.runtime_dir, name))
    }
}

/// Starts a `clowder-vmm` command line with its control socket at `control_path`, follows its
/// console into `log`, and connects to the control socket. A large machine takes a while to
/// populate its RAM: the VMM is given time while it reports progress ([`startup_deadline`]),
/// and the daemon's log says how far it got.
pub fn start_vmm(command: Command, control_path: PathBuf, log: Arc<LogBook>) -> Result<Box<dyn Machine>, String> {
    start_vmm_reporting(command, control_path, log, &mut |_| {})
}

/// [`start_vmm`], handing each of the VMM's reports of populated RAM to `progress` too.
pub fn start_vmm_reporting(
    mut command: Command,
    control_path: PathBuf,
    log: Arc<LogBook>,
    progress_to: &mut dyn FnMut(Populated),
) -> Result<Box<dyn Machine>, String> {
    let _ = std::fs::remove_file(&control_path);
    let memory = memory_of(&command);
    command.arg("--control").arg(&control_path).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
    log.push(format!("clowderd: clowder-vmm pid {}", child.id()));
    let progress = Progress::default();
    follow_console(child.stdout.take().expect("piped stdout"), log.clone(), "console: ", None);
    follow_console(child.stderr.take().expect("piped stderr"), log.clone(), "vmm: ", Some(progress.clone()));
    let mut reported = None;
    let control = loop {
        if let Ok(client) = ControlClient::connect(&control_path) {
            break client;
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{} before its control socket was up", describe_vmm_exit(status)));
        }
        let last = progress.lock().unwrap().clone();
        if let Some((at, report)) = last.as_ref().filter(|(at, _)| reported != Some(*at)) {
            log::info!("clowder-vmm {} ({}): guest RAM populated: {report}", child.id(), format_size(memory));
            reported = Some(*at);
            if let Some(populated) = Populated::parse(report) {
                progress_to(populated);
            }
        }
        if Instant::now() > startup_deadline(started, memory, reported) {
            let _ = child.kill();
            let _ = child.wait();
            let progress = last.map_or_else(|| "it reported no progress".to_string(), |(_, report)| format!("last report: {report}"));
            return Err(format!(
                "clowder-vmm did not open its control socket {} within {:.0} s ({} of guest RAM; {progress})",
                control_path.display(),
                started.elapsed().as_secs_f64(),
                format_size(memory)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(Box::new(VmmMachine { child, control, control_path, ended: None }))
}

impl Machine for VmmMachine {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn channel(&mut self) -> Result<ChannelParts, String> {
        let (memory, _): (MemoryReply, _) = self.control.request(&VmmRequest::Memory, &[])?;
        let ram = memory.ranges.iter().map(|r| RamRange { gpa: r.gpa, size: r.size, file_offset: r.file_offset }).collect();
        let (channel, files): (ChannelReply, _) = self.control.request(&VmmRequest::Channel, &[])?;
        let [memfd, doorbell, interrupt]: [File; 3] =
            files.try_into().map_err(|_| "the channel reply did not carry three descriptors".to_string())?;
        Ok(ChannelParts {
            memfd,
            ram,
            channel_gpa: channel.gpa,
            channel_size: channel.size,
            channel_offset: channel.memfd_offset,
            doorbell,
            interrupt,
        })
    }

    fn add_region(&mut self, file: &File, len: u64) -> Result<SharedRegion, String> {
        self.add_region_range(file, 0, len, RegionAccess::ReadWrite)
    }

    fn add_region_range(&mut self, file: &File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String> {
        let request = VmmRequest::AddRegion(AddRegion { offset, len, gpa: None, read_only: access == RegionAccess::ReadOnly });
        let (region, _): (Region, _) = self.control.request(&request, &[file.as_raw_fd()])?;
        Ok(SharedRegion { slot: region.slot, gpa: region.gpa })
    }

    fn add_region_pieces(&mut self, file: &File, pieces: &[clowder_api::vmm::Piece]) -> Option<Result<SharedRegion, String>> {
        let request = VmmRequest::AddPieces(AddPieces { pieces: pieces.to_vec(), gpa: None, read_only: false });
        let added = self.control.request::<Region>(&request, &[file.as_raw_fd()]);
        Some(added.map(|(region, _)| SharedRegion { slot: region.slot, gpa: region.gpa }))
    }

    fn remove_region(&mut self, slot: u32) -> Result<(), String> {
        self.control.request::<Region>(&VmmRequest::RemoveRegion { slot }, &[]).map(drop)
    }

    fn ended(&mut self) -> Option<String> {
        if self.ended.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.ended = Some(describe_vmm_exit(status));
            }
        }
        self.ended.clone()
    }

    fn shut_down(&mut self, grace: Duration) -> String {
        if let Some(ended) = self.ended() {
            return ended;
        }
        // SIGTERM makes clowder-vmm tear the VM down cleanly; SIGKILL if it does not in time.
        let _ = sys::send_signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(ended) = self.ended() {
                return ended;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let status = self.child.wait().map(describe_vmm_exit).unwrap_or_else(|e| format!("waiting for clowder-vmm: {e}"));
        self.ended = Some(status.clone());
        status
    }
}

impl Drop for VmmMachine {
    fn drop(&mut self) {
        self.shut_down(Duration::from_secs(1));
        let _ = std::fs::remove_file(&self.control_path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_larger_machine_gets_longer_to_start_and_progress_extends_the_wait() {
        let start = Instant::now();
        let secs = |at: Instant| at.duration_since(start).as_secs();
        // A small machine: the silence window plus a GiB's allowance.
        assert_eq!(secs(startup_deadline(start, 64 << 20, None)), 20);
        // The first window grows with memory: no fixed limit.
        assert_eq!(secs(startup_deadline(start, 16 << 30, None)), 170);
        assert!(startup_deadline(start, 64 << 30, None) > startup_deadline(start, 16 << 30, None));
        // Progress early changes nothing; progress late keeps the VMM alive as long as it goes on.
        assert_eq!(secs(startup_deadline(start, 1 << 30, Some(start + Duration::from_secs(5)))), 20);
        assert_eq!(secs(startup_deadline(start, 1 << 30, Some(start + Duration::from_secs(300)))), 310);
    }

    #[test]
    fn the_vmms_progress_reports_are_read() {
        let report = format!("{POPULATE_PROGRESS}1024 of 4096 MiB in 2.5 s");
        let populated = Populated::parse(report.strip_prefix(POPULATE_PROGRESS).unwrap());
        assert_eq!(populated, Some(Populated { done_mib: 1024, total_mib: 4096, elapsed_ms: 2500 }));
        for garbled in ["", "1024 of 4096", "x of 4096 MiB in 1 s", "1 of 2 MiB in soon s"] {
            assert_eq!(Populated::parse(garbled), None, "{garbled}");
        }
    }

    #[test]
    fn the_memory_is_read_from_the_vmm_command_line() {
        let spec = MachineSpec { name: "big".into(), cores: vec![1], memory: 16 << 30, hugepages: true, id_block: 0 };
        assert_eq!(memory_of(&vmm_command(Path::new("clowder-vmm"), Path::new("lwk"), &spec)), 16 << 30);
        assert_eq!(memory_of(&Command::new("clowder-vmm")), 64 << 20);
    }
}
