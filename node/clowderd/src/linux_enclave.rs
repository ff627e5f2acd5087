//! Linux virtual machines as enclaves (`clowder enclave create --kind linux`).
//!
//! The machine is a `clowder-vmm` booting a Linux kernel (by default the small one
//! `scripts/linux-kernel.sh` builds) with an initramfs whose `/init` is the enclave agent
//! (`kernels/linux-guest/agent`). The agent speaks the same enclave protocol as the LWK over
//! the same channel, from user space, so everything after the boot - `Hello`, pings, jobs,
//! their files, output and exit, the failure handling - is the LWK enclave's own code
//! (`enclave.rs`). What differs is only how the machine starts and how long its boot may take.
//! On PVM the VMM adds what the kernel must not use there (`vmm::arch::cpuid::LINUX_ON_PVM`).
//!
//! The job owner's host files reach the guest as the LWK's forwarded file calls (`hio.rs`,
//! served as that user, confined like an LWK job): the agent turns its jobs' FUSE requests
//! into them (kernels/linux-guest/agent/src/host_files.rs). What the calls read lands in the
//! file window, [`FILE_WINDOW`] bytes of guest RAM just below the channel that the kernel is
//! told to leave alone (`memmap=`) and the agent finds by `clowder.files=`. The daemon
//! checks every address the guest names against the enclave's RAM as for any enclave, so the
//! window is a convention between the guest's kernel and agent, not something it trusts.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clowder_api::daemon::Network;

mod guest_end;

use crate::console::LogBook;
use crate::machine::{start_vmm_reporting, vmm_command, Launcher, Machine, MachineSpec, Populated, VmmLauncher};

/// How long a Linux kernel may take from the VMM's start to the agent's `Hello`: the whole
/// boot is emulated kernel code on PVM, and on a loaded host its timer ticks, delivered late
/// and all, stretch it further (docs/linux-guest.md has the measured times: 15 min at a load
/// of 14-21).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(1800);

/// The kernel command line (the VMM appends its `clowder.*` words). `panic=-1`: a panicking
/// guest resets at once, by a triple fault (`reboot=t`), which ends the VMM and so the enclave
/// ([`guest_end`] says why); `quiet`: every console byte is an exit.
const COMMAND_LINE: &str = "console=ttyS0 panic=-1 reboot=t quiet";

/// The file window's size: the largest read one forwarded call makes (FUSE reads 128 KiB at
/// most) and a directory listing's share.
pub const FILE_WINDOW: u64 = 256 << 10;

/// The command line of a guest with `memory` bytes of RAM: [`COMMAND_LINE`] and the file
/// window, placed below the channel the VMM puts at the top of low RAM.
fn command_line(memory: u64) -> Result<String, String> {
    let layout = vmm::arch::memmap::GuestLayout::new(memory, vmm_config::DEFAULT_CHANNEL_SIZE)
        .map_err(|e| format!("a Linux enclave of {memory} bytes: {e}"))?;
    let channel = layout.channel.ok_or("the guest layout has no channel")?;
    let window = channel.gpa.checked_sub(FILE_WINDOW).filter(|&gpa| gpa >= 64 << 20).ok_or_else(|| {
        format!("a Linux enclave of {memory} bytes is too small for its kernel and file window (at least 64 MiB of low RAM)")
    })?;
    Ok(format!("{COMMAND_LINE} memmap={}K${window:#x} clowder.files={window:#x},{FILE_WINDOW:#x}", FILE_WINDOW >> 10))
}

/// Linux enclaves' jobs get their owner's host files unless this is `0` in the daemon's
/// environment: the off switch, for a test that wants jobs in the guest's own files alone.
pub const HOST_FILES_VARIABLE: &str = "CLOWDER_LINUX_HOST_FILES";

/// Whether the daemon serves host files to Linux enclaves (on unless [`HOST_FILES_VARIABLE`] is `0`).
pub fn host_files_enabled() -> bool {
    std::env::var_os(HOST_FILES_VARIABLE).is_none_or(|value| value != "0")
}

/// The kernel command line for a guest of `memory` bytes: with the file window when the
/// daemon serves host files.
fn guest_command_line(memory: u64) -> Result<String, String> {
    if host_files_enabled() {
        command_line(memory)
    } else {
        Ok(COMMAND_LINE.to_string())
    }
}

/// Where the daemon finds its default guest when `create` names none.
pub const KERNEL_VARIABLE: &str = "CLOWDER_LINUX_KERNEL";
pub const INITRD_VARIABLE: &str = "CLOWDER_LINUX_INITRD";

/// What a `create --kind linux` asked for: host paths, or the daemon's defaults, and a network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinuxRequest {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub net: Option<Network>,
}

/// Linux enclaves' taps are `clw-netN`, N picking the Nth /30 of [`NET_BASE`]/16.
const TAP_PREFIX: &str = "clw-net";
const NET_BASE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);
const NET_SLOTS: u32 = 1 << 14;
/// Slots being handed to a VMM that has not made its tap yet; once made, the tap itself says
/// the slot is taken (it lives exactly as long as its VMM, hence its enclave).
static STARTING: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// A Linux enclave's /30: the tap the VMM makes, the host's end and the guest's. The daemon
/// alone picks it; the guest is told its address on the kernel command line. Nothing is
/// routed beyond the tap: the VMM turns forwarding off on it, and no NAT is set up.
#[derive(Debug)]
pub struct NetLease {
    slot: u32,
}

impl NetLease {
    /// The first slot neither starting nor with a tap on the host (`taken` asks the host).
    fn take(taken: &dyn Fn(&str) -> bool) -> Result<NetLease, String> {
        let mut starting = STARTING.lock().unwrap();
        let slot = (0..NET_SLOTS)
            .find(|&slot| !starting.contains(&slot) && !taken(&tap_name(slot)))
            .ok_or_else(|| format!("every one of the {NET_SLOTS} Linux enclave networks ({NET_BASE}/16) is in use"))?;
        starting.insert(slot);
        Ok(NetLease { slot })
    }

    pub fn tap(&self) -> String {
        tap_name(self.slot)
    }

    pub fn host(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(NET_BASE) + self.slot * 4 + 1)
    }

    pub fn guest(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(NET_BASE) + self.slot * 4 + 2)
    }

    /// `clowder-vmm --net`'s value.
    fn vmm_flag(&self) -> String {
        format!("{},{}/30", self.tap(), self.host())
    }

    /// Linux's `ip=` (IP_PNP): the guest's address, the host's as the "server", no gateway, so
    /// eth0 is up before init runs and a job finds the host's end in /proc/cmdline.
    fn kernel_argument(&self) -> String {
        format!("ip={}:{}::255.255.255.252::eth0:off", self.guest(), self.host())
    }
}

impl Drop for NetLease {
    fn drop(&mut self) {
        STARTING.lock().unwrap().remove(&self.slot);
    }
}

fn tap_name(slot: u32) -> String {
    format!("{TAP_PREFIX}{slot}")
}

fn interface_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The kernel and initramfs, opened as the daemon and checked readable by the requesting user.
/// The VMM reads them through this process's descriptors (`/proc/PID/fd/N`), so what was
/// checked is what boots even if the paths change meanwhile.
pub struct LinuxGuest {
    kernel: File,
    initrd: File,
    net: Option<NetLease>,
}

impl LinuxGuest {
    /// Opens the guest for user `uid` (root may name any file; another user only files they
    /// own and may read, or that everyone may read).
    pub fn open(request: &LinuxRequest, uid: u32) -> Result<LinuxGuest, String> {
        let pick = |given: &Option<String>, variable: &str, what: &str| -> Result<PathBuf, String> {
            given.clone().or_else(|| std::env::var(variable).ok()).map(PathBuf::from).ok_or_else(|| {
                format!("no Linux {what}: pass --{what} FILE (scripts/linux-kernel.sh builds both), or start clowderd with {variable} set")
            })
        };
        let kernel = open_readable(&pick(&request.kernel, KERNEL_VARIABLE, "kernel")?, uid)?;
        let initrd = open_readable(&pick(&request.initrd, INITRD_VARIABLE, "initrd")?, uid)?;
        let net = request.net.map(|Network::Tap| NetLease::take(&interface_exists)).transpose()?;
        Ok(LinuxGuest { kernel, initrd, net })
    }

    pub fn net(&self) -> Option<&NetLease> {
        self.net.as_ref()
    }
}

fn open_readable(path: &Path, uid: u32) -> Result<File, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let metadata = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if !may_read(uid, metadata.uid(), metadata.mode()) {
        return Err(format!("{} is not readable by uid {uid}", path.display()));
    }
    Ok(file)
}

/// Whether `uid` may read a file of `owner` with `mode`, judged without groups (a file shared
/// with a group only is refused: the daemon does not take on the user's groups here).
fn may_read(uid: u32, owner: u32, mode: u32) -> bool {
    uid == 0 || (uid == owner && mode & 0o400 != 0) || mode & 0o004 != 0
}

fn descriptor_path(file: &File) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd())
}

/// The `clowder-vmm` command line of a Linux enclave.
pub fn linux_command(vmm: &Path, guest: &LinuxGuest, spec: &MachineSpec) -> Result<std::process::Command, String> {
    let mut command = vmm_command(vmm, Path::new(&descriptor_path(&guest.kernel)), spec);
    let mut line = guest_command_line(spec.memory)?;
    if let Some(net) = &guest.net {
        command.arg("--net").arg(net.vmm_flag());
        line = format!("{line} {}", net.kernel_argument());
    }
    command.arg("--module").arg(descriptor_path(&guest.initrd)).arg("--cmdline").arg(line);
    Ok(command)
}

/// [`Launcher::launch_linux`] for `clowder-vmm`.
pub fn launch_vmm(
    launcher: &VmmLauncher,
    spec: &MachineSpec,
    guest: &LinuxGuest,
    log: Arc<LogBook>,
    progress: &mut dyn FnMut(Populated),
) -> Result<Box<dyn Machine>, String> {
    let control_path = launcher.runtime_dir.join(format!("{}.vmm.sock", spec.name));
    log.push(format!("clowderd: starting clowder-vmm for Linux enclave {}", spec.name));
    if let Some(net) = guest.net() {
        log.push(format!(
            "clowderd: network: tap {}, host {}, guest {} (a /30, nothing routed beyond)",
            net.tap(),
            net.host(),
            net.guest()
        ));
    }
    let machine = start_vmm_reporting(
        with_xemem_device(linux_command(&launcher.vmm, guest, spec)?, launcher, spec),
        control_path,
        log.clone(),
        progress,
    )?;
    Ok(Box::new(guest_end::LinuxMachine::new(machine, log)))
}

/// Where a Linux enclave's VMM serves its XEMEM PCI device (docs/xemem-pci.md) for the daemon
/// to connect to, beside its control socket.
pub fn xemem_sockets(runtime_dir: &Path, name: &str) -> crate::xemem::vm::VmSockets {
    crate::xemem::vm::VmSockets {
        mailbox: runtime_dir.join(format!("{name}.xemem-pci.sock")),
        control: runtime_dir.join(format!("{name}.vmm.sock")),
    }
}

/// The VMM gives the guest the XEMEM PCI device, its mailbox served by this daemon.
fn with_xemem_device(mut command: std::process::Command, launcher: &VmmLauncher, spec: &MachineSpec) -> std::process::Command {
    command.env("CLOWDER_VMM_XEMEM_PCI", xemem_sockets(&launcher.runtime_dir, &spec.name).mailbox);
    command
}

/// The daemon's launcher, made to start Linux machines: what `Enclave::start` is given for a
/// `linux` enclave.
pub struct LinuxLauncher<'a> {
    pub inner: &'a dyn Launcher,
    pub guest: LinuxGuest,
}

impl Launcher for LinuxLauncher<'_> {
    fn launch(&self, spec: &MachineSpec, log: Arc<LogBook>, progress: &mut dyn FnMut(Populated)) -> Result<Box<dyn Machine>, String> {
        self.inner.launch_linux(spec, &self.guest, log, progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_the_user_may_read_boot() {
        assert!(may_read(0, 1000, 0o000), "root reads anything");
        assert!(may_read(1000, 1000, 0o400));
        assert!(!may_read(1000, 1000, 0o040), "the owner's own bits decide for the owner");
        assert!(may_read(1001, 0, 0o644));
        assert!(!may_read(1001, 0, 0o640), "a group-only file is refused");
        assert!(!may_read(1001, 0, 0o600));
    }

    #[test]
    fn the_guest_is_named_by_request_or_variable_and_checked() {
        let dir = std::env::temp_dir().join(format!("clowder-linux-enclave-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, b"kernel").unwrap();
        let missing =
            LinuxRequest { kernel: Some(kernel.display().to_string()), initrd: Some(dir.join("absent").display().to_string()), net: None };
        let error = LinuxGuest::open(&missing, 0).err().unwrap();
        assert!(error.contains("absent"), "{error}");
        let directory = LinuxRequest { kernel: Some(dir.display().to_string()), initrd: Some(kernel.display().to_string()), net: None };
        assert!(LinuxGuest::open(&directory, 0).err().unwrap().contains("not a regular file"));
        std::fs::set_permissions(&kernel, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let private = LinuxRequest { kernel: Some(kernel.display().to_string()), initrd: Some(kernel.display().to_string()), net: None };
        assert!(LinuxGuest::open(&private, 4242).err().unwrap().contains("not readable by uid 4242"));
        let guest = LinuxGuest::open(&private, 0).unwrap();
        let spec = MachineSpec { name: "vm".into(), cores: vec![1], memory: 256 << 20, hugepages: false, id_block: 0 };
        let command = linux_command(Path::new("clowder-vmm"), &guest, &spec).unwrap();
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(args.windows(2).any(|w| w[0] == "--module" && w[1].starts_with("/proc/")), "{args:?}");
        assert!(args.windows(2).any(|w| w[0] == "--cmdline" && w[1].starts_with(COMMAND_LINE)), "{args:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each network is a /30 of its own, skipping slots another enclave is starting on or whose
    /// tap exists on the host; the VMM and the guest's kernel are told the same addresses.
    #[test]
    fn each_network_gets_a_free_slash_30() {
        let host_has = |name: &str| name == "clw-net0" || name == "clw-net2";
        let first = NetLease::take(&host_has).unwrap();
        let second = NetLease::take(&host_has).unwrap();
        assert_eq!((first.tap(), second.tap()), ("clw-net1".to_string(), "clw-net3".to_string()));
        assert_eq!((first.host(), first.guest()), (Ipv4Addr::new(10, 77, 0, 5), Ipv4Addr::new(10, 77, 0, 6)));
        assert_eq!(first.vmm_flag(), "clw-net1,10.77.0.5/30");
        assert_eq!(first.kernel_argument(), "ip=10.77.0.6:10.77.0.5::255.255.255.252::eth0:off");
        drop(first);
        assert_eq!(NetLease::take(&host_has).unwrap().tap(), "clw-net1", "a lease ended frees its slot");
        assert!(NetLease::take(&|_| true).unwrap_err().contains("in use"));
    }

    /// The window lies in RAM just below the channel (the kernel keeps out of it, the daemon
    /// serves file calls into it as into any enclave RAM), and a guest too small for it is
    /// refused in one line.
    #[test]
    fn the_file_window_sits_below_the_channel() {
        let line = command_line(256 << 20).unwrap();
        let channel = (256 << 20) - vmm_config::DEFAULT_CHANNEL_SIZE;
        let window = channel - FILE_WINDOW;
        assert!(line.ends_with(&format!(" memmap=256K${window:#x} clowder.files={window:#x},{FILE_WINDOW:#x}")), "{line}");
        let big = command_line(8 << 30).unwrap();
        assert!(big.contains(&format!("clowder.files={:#x},", (3u64 << 30) - vmm_config::DEFAULT_CHANNEL_SIZE - FILE_WINDOW)), "{big}");
        assert!(command_line(32 << 20).unwrap_err().contains("too small"));
    }

    /// What a Linux guest's agent forwards for its FUSE mount is served as any enclave's file
    /// calls, bad input included: reads land in the file window, and a window moved onto the
    /// channel or past RAM, an oversized listing, an unknown handle, a write or a way out of
    /// a confinement get errnos, never a crash.
    #[test]
    fn a_guests_forwarded_file_calls_are_checked_like_any_enclaves() {
        use crate::guest_ram::{GuestRam, RamRange};
        use crate::hio::{Answer, Identity, JobFiles, Scope};
        use enclave_proto::FileOp;

        const MEMORY: u64 = 256 << 20;
        let channel = MEMORY - vmm_config::DEFAULT_CHANNEL_SIZE;
        let window = channel - FILE_WINDOW;
        let memfd = crate::sys::memfd("linux-enclave-test").unwrap();
        memfd.set_len(MEMORY).unwrap();
        let ram =
            GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: MEMORY, file_offset: 0 }], (channel, vmm_config::DEFAULT_CHANNEL_SIZE))
                .unwrap();
        let dir = std::env::temp_dir().join(format!("clowder-linux-files-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/data"), "host bytes").unwrap();
        let root = dir.to_str().unwrap().to_string();
        let scope = Scope::Confined { dir: File::open(&dir).unwrap(), path: root.clone() };
        let owner = Identity { uid: 0, gid: 0, groups: vec![] };
        let mut files = JobFiles::new(File::open(&dir).unwrap(), root, scope, owner);
        let mut serve = |op: FileOp<'_>| files.serve(&op, &ram).result;

        let Ok(Answer::Value(handle)) = serve(FileOp::Open { path: b"sub/data", flags: libc::O_RDONLY as u32, mode: 0 }) else {
            panic!("open")
        };
        let handle = handle as u32;
        assert!(matches!(serve(FileOp::Pread { handle, gpa: window, len: FILE_WINDOW as u32, offset: 0 }), Ok(Answer::Value(10))));
        let mut back = [0u8; 10];
        ram.read(window, &mut back).unwrap();
        assert_eq!(&back, b"host bytes");
        let onto_channel = serve(FileOp::Pread { handle, gpa: channel, len: 4096, offset: 0 });
        assert!(matches!(onto_channel, Err(libc::EFAULT)), "the channel is never a buffer");
        assert!(matches!(serve(FileOp::Pread { handle, gpa: MEMORY, len: 4096, offset: 0 }), Err(libc::EFAULT)), "past RAM");
        assert!(matches!(serve(FileOp::Pread { handle: 999, gpa: window, len: 10, offset: 0 }), Err(libc::EBADF)));
        assert!(matches!(serve(FileOp::Getdents { handle, gpa: window, len: u32::MAX }), Err(libc::EINVAL)), "an oversized listing");
        assert!(matches!(serve(FileOp::Stat { path: b"../../etc/shadow" }), Err(libc::EACCES)), "out of the confinement");
        assert!(serve(FileOp::Stat { path: b"sub/\xff" }).is_err(), "a path that is not UTF-8");
        assert!(matches!(serve(FileOp::Stat { path: b"/usr/lib" }), Ok(Answer::Attributes(_))), "the system's libraries");
        let write = FileOp::Open { path: b"/usr/lib/x", flags: (libc::O_WRONLY | libc::O_CREAT) as u32, mode: 0o644 };
        assert!(matches!(serve(write), Err(libc::EROFS)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
