//! A configuration as read from the file and the flags, before the checks that need the whole
//! picture (page size against memory size, cores against the host, kernel against protocol).

use std::path::PathBuf;

use crate::{Backing, BootProtocol, DeviceConfig, DeviceKind, SerialOutput, SmpStart, UnclaimedPorts};

/// Guest RAM when neither the file nor `--mem` gives a size.
pub const DEFAULT_MEMORY_SIZE: u64 = 128 << 20;
pub const DEFAULT_SERIAL_PORT: u16 = 0x3f8;
pub const DEFAULT_SERIAL_IRQ: u32 = 4;
pub const DEFAULT_EXIT_PORT: u16 = 0xf4;
pub const DEFAULT_HYPERCALL_PORT: u16 = 0x510;
pub const DEFAULT_CHANNEL_SIZE: u64 = 64 << 10;
pub const DEFAULT_CHANNEL_PORT: u16 = 0x520;
pub const DEFAULT_CHANNEL_VECTOR: u8 = 0x40;

/// A value with the key (`memory.size`) or flag (`--mem`) that set it, so that an error found
/// after file and flags are merged names what the user actually wrote.
#[derive(Debug)]
pub(crate) struct Setting<T> {
    pub value: T,
    pub key: String,
}

impl<T> Setting<T> {
    pub(crate) fn new(value: T, key: impl Into<String>) -> Setting<T> {
        Setting { value, key: key.into() }
    }
}

#[derive(Debug)]
pub(crate) struct Draft {
    pub memory_size: Setting<u64>,
    pub backing: Setting<Backing>,
    pub cpu_count: Setting<u64>,
    pub cores: Option<Setting<Vec<usize>>>,
    pub kernel: Option<Setting<PathBuf>>,
    pub cmdline: Setting<String>,
    pub modules: Vec<Setting<PathBuf>>,
    pub protocol: Setting<BootProtocol>,
    pub smp: SmpStart,
    pub unclaimed_ports: UnclaimedPorts,
    pub watchdog_ms: Option<u64>,
    pub control_socket: Option<Setting<PathBuf>>,
    pub devices: Vec<DeviceConfig>,
    /// `--serial`: replaces the output of the first serial device.
    pub serial_output_override: Option<Setting<SerialOutput>>,
}

impl Default for Draft {
    fn default() -> Draft {
        Draft {
            memory_size: Setting::new(DEFAULT_MEMORY_SIZE, "memory.size"),
            backing: Setting::new(Backing::Page4K, "memory.backing"),
            cpu_count: Setting::new(1, "cpus.count"),
            cores: None,
            kernel: None,
            cmdline: Setting::new(String::new(), "boot.cmdline"),
            modules: Vec::new(),
            protocol: Setting::new(BootProtocol::Auto, "boot.protocol"),
            smp: SmpStart::Direct,
            unclaimed_ports: UnclaimedPorts::Auto,
            watchdog_ms: None,
            control_socket: None,
            devices: default_devices(),
            serial_output_override: None,
        }
    }
}

/// The devices of a VM whose configuration lists none: what docs/guest-abi.md promises a guest.
pub(crate) fn default_devices() -> Vec<DeviceConfig> {
    let device = |name: &str, kind| DeviceConfig { name: name.to_string(), kind };
    vec![
        device("serial0", DeviceKind::Serial { port: DEFAULT_SERIAL_PORT, irq: DEFAULT_SERIAL_IRQ, output: SerialOutput::Stdout }),
        device("exit0", DeviceKind::Exit { port: DEFAULT_EXIT_PORT }),
        device("hypercall0", DeviceKind::Hypercall { port: DEFAULT_HYPERCALL_PORT }),
        device(
            "channel0",
            DeviceKind::Channel { size: DEFAULT_CHANNEL_SIZE, doorbell_port: DEFAULT_CHANNEL_PORT, vector: DEFAULT_CHANNEL_VECTOR },
        ),
    ]
}
