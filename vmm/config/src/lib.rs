//! Configuration of one clowder virtual machine.
//!
//! A VM is described by a TOML file, by `clowder-vmm` command-line flags, or both (flags override
//! the file). Everything is validated before any KVM object exists, and every problem is reported
//! as one line that names the key and the reason (`ConfigError`).
//!
//! - [`VmConfig::from_file`] / [`VmConfig::from_toml_str`]: the TOML file (format in the README of
//!   this crate and in `VmConfig::to_toml_string`'s output).
//! - [`VmConfig::from_args`]: the `clowder-vmm` command line; `--help` is reported as an error for
//!   which [`ConfigError::is_help_request`] is true, and the text to print is [`USAGE`].

mod args;
mod draft;
mod file;
mod host;
mod validate;
mod values;
mod write;

#[cfg(test)]
mod tests;

use std::ops::Range;
use std::path::{Path, PathBuf};

pub use args::USAGE;
pub use draft::{
    DEFAULT_CHANNEL_PORT, DEFAULT_CHANNEL_SIZE, DEFAULT_CHANNEL_VECTOR, DEFAULT_EXIT_PORT, DEFAULT_HYPERCALL_PORT, DEFAULT_MEMORY_SIZE,
    DEFAULT_SERIAL_IRQ, DEFAULT_SERIAL_PORT,
};

/// A validated VM configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VmConfig {
    pub memory: MemoryConfig,
    /// One entry per vCPU, in vCPU index order.
    pub vcpus: Vec<VcpuConfig>,
    pub boot: BootConfig,
    /// Devices in configuration order; each is created by name from the device registry.
    pub devices: Vec<DeviceConfig>,
    /// End the VM if the guest sends no `heartbeat` hypercall (or any other exit) for this long.
    /// `None`: no watchdog (an HPC job may compute for hours without exiting).
    pub watchdog_ms: Option<u64>,
    /// Unix socket on which the VM accepts control requests (pause, resume, stop, stats, memory
    /// regions, channel file descriptors).
    pub control_socket: Option<PathBuf>,
}

impl VmConfig {
    /// Parses and validates a TOML configuration; relative paths in it resolve against
    /// `base_dir`. Validation reads the host (CPU affinity, hugepages) and the kernel and module
    /// files.
    pub fn from_toml_str(text: &str, base_dir: impl AsRef<Path>) -> Result<VmConfig, ConfigError> {
        let draft = file::parse_document(text, base_dir.as_ref(), "config")?;
        validate::finish(draft, &host::HostFacts::probe())
    }

    /// Reads, parses and validates a TOML file; relative paths resolve against its directory.
    pub fn from_file(path: impl AsRef<Path>) -> Result<VmConfig, ConfigError> {
        let draft = file::read_file(path.as_ref())?;
        validate::finish(draft, &host::HostFacts::probe())
    }

    /// Parses the `clowder-vmm` arguments (without the program name): `--config FILE` first, then
    /// the other flags override it (see [`USAGE`]). `--help` or `-h` anywhere gives an error for
    /// which [`ConfigError::is_help_request`] is true: print [`USAGE`] and exit successfully.
    pub fn from_args(args: &[String]) -> Result<VmConfig, ConfigError> {
        let draft = args::draft_from_args(args)?;
        validate::finish(draft, &host::HostFacts::probe())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Ordinary memfd, 4 KiB pages.
    Page4K,
    /// hugetlb memfd with 2 MiB pages; needs `vm.nr_hugepages`.
    Huge2M,
}

impl Backing {
    pub fn page_size(self) -> u64 {
        match self {
            Backing::Page4K => 4096,
            Backing::Huge2M => 2 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig {
    /// Bytes of guest RAM; a multiple of the backing's page size.
    pub size: u64,
    pub backing: Backing,
}

/// Guest RAM stops here; the rest continues at [`HIGH_RAM_START`], leaving a hole for MMIO.
pub const LOW_RAM_LIMIT: u64 = 3 << 30;
pub const HIGH_RAM_START: u64 = 4 << 30;
/// The register window of a virtio-mmio device.
pub const VIRTIO_MMIO_SIZE: u64 = 0x200;

impl MemoryConfig {
    /// Guest-physical ranges of RAM: `[0, size)`, or `[0, 3 GiB)` and `[4 GiB, ...)` for more than
    /// 3 GiB (docs/guest-abi.md).
    // A list holding one range is meant here, not the list of that range's addresses.
    #[allow(clippy::single_range_in_vec_init)]
    pub fn ram_ranges(&self) -> Vec<Range<u64>> {
        if self.size <= LOW_RAM_LIMIT {
            vec![0..self.size]
        } else {
            vec![0..LOW_RAM_LIMIT, HIGH_RAM_START..HIGH_RAM_START + (self.size - LOW_RAM_LIMIT)]
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct VcpuConfig {
    /// Host CPU this vCPU's thread is pinned to; `None` leaves it unpinned.
    pub host_core: Option<usize>,
}

/// How the kernel is entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootProtocol {
    /// Chosen from the image: PVH for an ELF64 with a PVH note, Linux for a bzImage,
    /// 64-bit direct for an ELF64 without a PVH note.
    Auto,
    Pvh,
    Direct64,
    Linux,
}

/// How application processors are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmpStart {
    /// Every vCPU starts at the kernel entry (64-bit direct only); for PVH and Linux boots the
    /// application processors wait for INIT/SIPI.
    Direct,
    /// Only vCPU 0 starts; the guest brings up the others with INIT/SIPI/SIPI.
    Sipi,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BootConfig {
    pub kernel: PathBuf,
    pub cmdline: String,
    /// PVH modules; for a bzImage the first one is the initrd.
    pub modules: Vec<PathBuf>,
    pub protocol: BootProtocol,
    pub smp: SmpStart,
    pub unclaimed_ports: UnclaimedPorts,
}

/// What the VMM does with port I/O no device claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnclaimedPorts {
    /// `log` for Linux guests (a bzImage, or an ELF whose Xen guest-OS note says "linux"),
    /// `fail` otherwise.
    Auto,
    /// Stop the VM and report the access: for clowder's own kernels an unclaimed port is a bug.
    Fail,
    /// Reads return all ones, writes are dropped, each port is logged once: Linux probes legacy
    /// hardware that is not there.
    Log,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SerialOutput {
    Stdout,
    File(PathBuf),
    /// The VMM listens on this Unix socket and streams output to whoever connects.
    UnixSocket(PathBuf),
    Null,
}

/// A device instance; `kind` selects the device model by name from the registry.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    pub name: String,
    pub kind: DeviceKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DeviceKind {
    /// 16550 UART.
    Serial { port: u16, irq: u32, output: SerialOutput },
    /// Power-off port: the value written becomes the exit status.
    Exit { port: u16 },
    /// Hypercall port (number in EAX, arguments in RDI, RSI, R8, R9, result in RAX).
    Hypercall { port: u16 },
    /// Enclave channel: ring pair in reserved RAM, doorbell port (ioeventfd), vector (irqfd).
    Channel { size: u64, doorbell_port: u16, vector: u8 },
    /// A page of guest-visible registers behind MMIO exits (probing and tests).
    MmioScratch { base: u64, size: u64 },
    /// Model-specific registers handled in user space (probing and tests).
    MsrScratch { msrs: Vec<u32> },
    /// virtio-net over virtio-mmio at `base` (0x200 bytes), interrupt on IOAPIC pin `irq`, backed
    /// by the host tap `tap`, whose host end gets `host` (IPv4 address, prefix length) if given.
    VirtioNet { base: u64, irq: u32, tap: String, host: Option<(std::net::Ipv4Addr, u8)> },
}

impl DeviceKind {
    /// The `kind` string of the configuration file.
    pub fn kind_name(&self) -> &'static str {
        match self {
            DeviceKind::Serial { .. } => "serial",
            DeviceKind::Exit { .. } => "exit",
            DeviceKind::Hypercall { .. } => "hypercall",
            DeviceKind::Channel { .. } => "channel",
            DeviceKind::MmioScratch { .. } => "mmio-scratch",
            DeviceKind::MsrScratch { .. } => "msr-scratch",
            DeviceKind::VirtioNet { .. } => "virtio-net",
        }
    }

    /// I/O ports the device claims, as (first port, count): the 16550's eight registers, the
    /// 4-byte accesses of the other port devices.
    pub fn port_window(&self) -> Option<(u16, u16)> {
        match self {
            DeviceKind::Serial { port, .. } => Some((*port, 8)),
            DeviceKind::Exit { port } | DeviceKind::Hypercall { port } => Some((*port, 4)),
            DeviceKind::Channel { doorbell_port, .. } => Some((*doorbell_port, 4)),
            DeviceKind::MmioScratch { .. } | DeviceKind::MsrScratch { .. } | DeviceKind::VirtioNet { .. } => None,
        }
    }

    /// Guest-physical MMIO window, as (base, size).
    pub fn mmio_window(&self) -> Option<(u64, u64)> {
        match self {
            DeviceKind::MmioScratch { base, size } => Some((*base, *size)),
            DeviceKind::VirtioNet { base, .. } => Some((*base, VIRTIO_MMIO_SIZE)),
            _ => None,
        }
    }
}

/// A configuration problem: the key it concerns and why it is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key (`memory.size`, `cpus.cores`, `device.serial0.port`), flag (`--mem`), or the
    /// file's path for problems with the file as a whole (unreadable, TOML syntax).
    pub key: String,
    pub reason: String,
}

/// The key of the error [`VmConfig::from_args`] returns for `--help`.
const HELP_KEY: &str = "--help";

impl ConfigError {
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError { key: key.into(), reason: reason.into() }
    }

    fn help_request() -> ConfigError {
        ConfigError::new(HELP_KEY, "usage requested: print vmm_config::USAGE")
    }

    /// True for the error `--help` produces: print [`USAGE`] and exit 0 rather than failing.
    pub fn is_help_request(&self) -> bool {
        self.key == HELP_KEY
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod test_support {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A directory under the system temp dir, removed on drop; unique per test in this process.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new() -> TempDir {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let name = format!("vmm-config-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
            let path = std::env::temp_dir().join(name);
            std::fs::create_dir_all(&path).expect("create temp dir");
            TempDir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }

        /// Writes `bytes` to `name` inside the directory and returns the file's path.
        pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, bytes).expect("write temp file");
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
