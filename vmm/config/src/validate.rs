//! The checks that need the merged configuration (file and flags) or the host: page size against
//! memory size, cores against the CPUs we may run on, the kernel image against the protocol,
//! device windows against each other and against guest RAM.

use std::path::Path;

use hwspec::{describe_size, format_cpu_list, MIB, TIB};

use crate::draft::{Draft, Setting};
use crate::host::{inspect_kernel, open_readable, HostFacts, KernelImage};
use crate::values::{backing_name, protocol_name};
use crate::{Backing, BootConfig, BootProtocol, ConfigError, DeviceConfig, DeviceKind, MemoryConfig, SerialOutput, VcpuConfig, VmConfig};

/// The kernel loads at 1 MiB; less than 2 MiB cannot hold it.
const MIN_MEMORY: u64 = 2 * MIB;
/// Far beyond any VM we run; a typo ("1024G" for "1024M") should not try to map it.
const MAX_MEMORY: u64 = TIB;
/// APIC ID 255 is the broadcast destination, so x2APIC-less guests address at most 255 CPUs.
const MAX_VCPUS: u64 = 255;
/// Longest command line the boot protocols accept (4 KiB page, NUL-terminated).
const CMDLINE_LIMIT: usize = 4095;
/// Room kept for the `clowder.*` keys the VMM appends to the user's command line.
const CMDLINE_HEADROOM: usize = 256;
const LAPIC_BASE: u64 = 0xfee0_0000;
const IOAPIC_BASE: u64 = 0xfec0_0000;
const APIC_WINDOW_SIZE: u64 = 0x1000;
/// Ports a device would never see: KVM's in-kernel PIC, PIT and speaker stub (the VMM creates
/// them) and the POST-code port the VMM ignores. Half-open ranges.
const PORTS_HANDLED_ELSEWHERE: &[(u32, u32, &str)] = &[
    (0x20, 0x22, "the in-kernel PIC (0x20..=0x21)"),
    (0x40, 0x44, "the in-kernel PIT (0x40..=0x43)"),
    (0x61, 0x62, "the in-kernel PC speaker stub (0x61)"),
    (0x80, 0x81, "the POST-code port the VMM ignores (0x80)"),
    (0xa0, 0xa2, "the in-kernel PIC (0xa0..=0xa1)"),
    (0x4d0, 0x4d2, "the in-kernel PIC's ELCR (0x4d0..=0x4d1)"),
];
/// The PVH module list (0x6040..0x6800, 32 bytes an entry) holds at most this many modules.
const MAX_MODULES: usize = 62;
/// `sockaddr_un.sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

pub(crate) fn finish(draft: Draft, host: &HostFacts) -> Result<VmConfig, ConfigError> {
    let memory = check_memory(&draft, host)?;
    let vcpus = check_vcpus(&draft, host)?;
    let boot = check_boot(&draft)?;
    let devices = check_devices(&draft, &memory)?;
    let control_socket = match &draft.control_socket {
        Some(socket) => {
            check_socket_path(&socket.value).map_err(|reason| ConfigError::new(&socket.key, reason))?;
            Some(socket.value.clone())
        }
        None => None,
    };
    Ok(VmConfig { memory, vcpus, boot, devices, watchdog_ms: draft.watchdog_ms, control_socket })
}

/// How a setting reads where the user wrote it: `--backing 2m` or `memory.backing = "2m"`;
/// `file_literal` is the value as TOML writes it (quoted or not).
fn as_written(key: &str, value: &str, file_literal: &str) -> String {
    if key.starts_with("--") {
        format!("{key} {value}")
    } else {
        format!("{key} = {file_literal}")
    }
}

fn check_memory(draft: &Draft, host: &HostFacts) -> Result<MemoryConfig, ConfigError> {
    let Setting { value: size, key: size_key } = &draft.memory_size;
    let Setting { value: backing, key: backing_key } = &draft.backing;
    let error = |reason: String| Err(ConfigError::new(size_key, reason));
    if *size < MIN_MEMORY {
        return error(format!("{} is too small: at least 2 MiB (the kernel loads at 1 MiB)", describe_size(*size)));
    }
    if *size > MAX_MEMORY {
        return error(format!("{} is more than the 1 TiB limit", describe_size(*size)));
    }
    let page_size = backing.page_size();
    if size % page_size != 0 {
        return error(format!(
            "{} is not a multiple of the {} page size ({})",
            describe_size(*size),
            describe_size(page_size),
            as_written(backing_key, backing_name(*backing), &format!("\"{}\"", backing_name(*backing)))
        ));
    }
    if *backing == Backing::Huge2M {
        let needed = size / page_size;
        let shortage = match host.hugepages_2m {
            None => Some("this kernel has no 2 MiB hugepage pool".to_string()),
            Some(pool) if pool.free < needed => Some(format!(
                "{} {} free (reserve them with: sysctl vm.nr_hugepages={})",
                pool.free,
                if pool.free == 1 { "is" } else { "are" },
                pool.total + (needed - pool.free)
            )),
            Some(_) => None,
        };
        if let Some(shortage) = shortage {
            return Err(ConfigError::new(backing_key, format!("2m backing needs {needed} free 2 MiB hugepages, {shortage}")));
        }
    }
    Ok(MemoryConfig { size: *size, backing: *backing })
}

fn check_vcpus(draft: &Draft, host: &HostFacts) -> Result<Vec<VcpuConfig>, ConfigError> {
    let Setting { value: count, key: count_key } = &draft.cpu_count;
    if *count == 0 {
        return Err(ConfigError::new(count_key, "must be at least 1"));
    }
    if *count > MAX_VCPUS {
        return Err(ConfigError::new(count_key, format!("{count} is more than {MAX_VCPUS} vCPUs (APIC ID 255 is the broadcast address)")));
    }
    let Some(Setting { value: cores, key: cores_key }) = &draft.cores else {
        return Ok(vec![VcpuConfig { host_core: None }; *count as usize]);
    };
    if cores.len() as u64 != *count {
        return Err(ConfigError::new(
            cores_key,
            format!(
                "lists {} cores for {count} vCPUs ({}); give one core per vCPU",
                cores.len(),
                as_written(count_key, &count.to_string(), &count.to_string())
            ),
        ));
    }
    for (vcpu, core) in cores.iter().enumerate() {
        if !host.usable_cpus.contains(core) {
            return Err(ConfigError::new(
                cores_key,
                format!(
                    "core {core} (for vCPU {vcpu}) is not present: not online or not in this process's CPU affinity (usable: {})",
                    format_cpu_list(host.usable_cpus.iter().copied())
                ),
            ));
        }
    }
    Ok(cores.iter().map(|&core| VcpuConfig { host_core: Some(core) }).collect())
}

fn check_boot(draft: &Draft) -> Result<BootConfig, ConfigError> {
    let kernel = draft
        .kernel
        .as_ref()
        .ok_or_else(|| ConfigError::new("boot.kernel", "missing: give the kernel image (boot.kernel in the file, or --kernel)"))?;
    let image = inspect_kernel(&kernel.value).map_err(|reason| ConfigError::new(&kernel.key, reason))?;

    let Setting { value: protocol, key: protocol_key } = &draft.protocol;
    let kernel_shown = kernel.value.display();
    let mismatch = match (protocol, image) {
        (BootProtocol::Pvh, KernelImage::Elf64 { has_pvh_note: false }) => {
            Some(format!("{kernel_shown} has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); use direct64 or auto"))
        }
        (BootProtocol::Pvh | BootProtocol::Direct64, KernelImage::BzImage) => {
            Some(format!("{kernel_shown} is a bzImage, not an ELF64; use linux or auto"))
        }
        (BootProtocol::Linux, KernelImage::Elf64 { .. }) => {
            Some(format!("{kernel_shown} is an ELF64, not a bzImage; use pvh, direct64 or auto"))
        }
        _ => None,
    };
    if let Some(reason) = mismatch {
        return Err(ConfigError::new(protocol_key, format!("{} cannot boot it: {reason}", protocol_name(*protocol))));
    }

    for module in &draft.modules {
        open_readable(&module.value).map_err(|reason| ConfigError::new(&module.key, reason))?;
    }
    if let Some(extra) = draft.modules.get(MAX_MODULES) {
        return Err(ConfigError::new(
            &extra.key,
            format!("{} modules given, the PVH module list holds at most {MAX_MODULES}", draft.modules.len()),
        ));
    }
    let boots_linux = matches!((protocol, image), (BootProtocol::Linux, _) | (BootProtocol::Auto, KernelImage::BzImage));
    if boots_linux && draft.modules.len() > 1 {
        return Err(ConfigError::new(
            &draft.modules[1].key,
            format!("a Linux boot takes one module (the initrd), {} are given", draft.modules.len()),
        ));
    }

    let Setting { value: cmdline, key: cmdline_key } = &draft.cmdline;
    if cmdline.contains('\0') {
        return Err(ConfigError::new(cmdline_key, "contains a NUL byte"));
    }
    let max_length = CMDLINE_LIMIT - CMDLINE_HEADROOM;
    if cmdline.len() > max_length {
        return Err(ConfigError::new(
            cmdline_key,
            format!(
                "is {} bytes, at most {max_length} are allowed: the limit is {CMDLINE_LIMIT} and {CMDLINE_HEADROOM} bytes are kept for the clowder.* keys the VMM appends",
                cmdline.len()
            ),
        ));
    }

    Ok(BootConfig {
        kernel: kernel.value.clone(),
        cmdline: cmdline.clone(),
        modules: draft.modules.iter().map(|module| module.value.clone()).collect(),
        protocol: *protocol,
        smp: draft.smp,
        unclaimed_ports: draft.unclaimed_ports,
    })
}

fn check_devices(draft: &Draft, memory: &MemoryConfig) -> Result<Vec<DeviceConfig>, ConfigError> {
    let mut devices = draft.devices.clone();
    // Key under which each device's serial output is reported: `--serial` for the one it replaced.
    let mut output_keys: Vec<String> = devices.iter().map(|device| format!("device.{}.output", device.name)).collect();
    if let Some(Setting { value: new_output, key }) = &draft.serial_output_override {
        let position = devices
            .iter()
            .position(|device| matches!(device.kind, DeviceKind::Serial { .. }))
            .ok_or_else(|| ConfigError::new(key, "the configuration has no serial device to redirect"))?;
        if let DeviceKind::Serial { output, .. } = &mut devices[position].kind {
            *output = new_output.clone();
        }
        output_keys[position] = key.clone();
    }

    for (index, device) in devices.iter().enumerate() {
        let key = |name: &str| format!("device.{}.{name}", device.name);
        let earlier = &devices[..index];

        if earlier.iter().any(|other| other.name == device.name) {
            return Err(ConfigError::new(key("name"), format!("two devices are named \"{}\"; names must be unique", device.name)));
        }
        // The guest learns these ports from single command-line keys (clowder.exit_port, ...).
        if matches!(device.kind, DeviceKind::Exit { .. } | DeviceKind::Hypercall { .. } | DeviceKind::Channel { .. }) {
            if let Some(other) = earlier.iter().find(|other| other.kind.kind_name() == device.kind.kind_name()) {
                return Err(ConfigError::new(
                    key("kind"),
                    format!("a VM has at most one {} device, and \"{}\" is one already", device.kind.kind_name(), other.name),
                ));
            }
        }

        if let Some((first, count)) = device.kind.port_window() {
            let (first, end) = (first as u32, first as u32 + count as u32);
            let ports = format!("ports {first:#x}..={:#x}", end - 1);
            if end > 0x1_0000 {
                return Err(ConfigError::new(key("port"), format!("{ports} run past 0xffff")));
            }
            let mut taken: Vec<(u32, u32, String)> =
                PORTS_HANDLED_ELSEWHERE.iter().map(|&(start, stop, what)| (start, stop, what.to_string())).collect();
            for other in earlier {
                if let Some((other_first, other_count)) = other.kind.port_window() {
                    let (other_first, other_end) = (other_first as u32, other_first as u32 + other_count as u32);
                    let what = format!("ports {other_first:#x}..={:#x} of \"{}\"", other_end - 1, other.name);
                    taken.push((other_first, other_end, what));
                }
            }
            if let Some((_, _, what)) = taken.iter().find(|(start, stop, _)| first < *stop && *start < end) {
                return Err(ConfigError::new(key("port"), format!("{ports} overlap {what}")));
            }
        }

        if let Some((base, size)) = device.kind.mmio_window() {
            let end = base + size;
            let window = format!("MMIO window {base:#x}..{end:#x}");
            let mut taken: Vec<(u64, u64, String)> = memory
                .ram_ranges()
                .into_iter()
                .map(|ram| (ram.start, ram.end, format!("guest RAM {:#x}..{:#x}", ram.start, ram.end)))
                .collect();
            taken.push((LAPIC_BASE, LAPIC_BASE + APIC_WINDOW_SIZE, format!("the LAPIC at {LAPIC_BASE:#x}")));
            taken.push((IOAPIC_BASE, IOAPIC_BASE + APIC_WINDOW_SIZE, format!("the IOAPIC at {IOAPIC_BASE:#x}")));
            for other in earlier {
                if let Some((other_base, other_size)) = other.kind.mmio_window() {
                    taken.push((other_base, other_base + other_size, format!("the MMIO window of \"{}\"", other.name)));
                }
            }
            if let Some((_, _, what)) = taken.iter().find(|(start, stop, _)| base < *stop && *start < end) {
                return Err(ConfigError::new(key("base"), format!("{window} overlaps {what}")));
            }
        }

        match &device.kind {
            DeviceKind::MsrScratch { msrs } => {
                for other in earlier {
                    if let DeviceKind::MsrScratch { msrs: other_msrs } = &other.kind {
                        if let Some(msr) = msrs.iter().find(|msr| other_msrs.contains(msr)) {
                            return Err(ConfigError::new(key("msrs"), format!("MSR {msr:#x} is handled by \"{}\" already", other.name)));
                        }
                    }
                }
            }
            DeviceKind::Channel { size, .. } => {
                // The channel sits at the top of low RAM; the kernel needs the space from 1 MiB.
                let low_ram_end = memory.ram_ranges()[0].end;
                if size + MIN_MEMORY > low_ram_end {
                    return Err(ConfigError::new(
                        key("size"),
                        format!(
                            "{} does not fit at the top of low RAM ({}) with room for the kernel at 1 MiB",
                            describe_size(*size),
                            describe_size(low_ram_end)
                        ),
                    ));
                }
            }
            DeviceKind::Serial { output, .. } => {
                let output_key = &output_keys[index];
                match output {
                    SerialOutput::File(path) => check_parent_directory(path),
                    SerialOutput::UnixSocket(path) => check_socket_path(path),
                    SerialOutput::Stdout | SerialOutput::Null => Ok(()),
                }
                .map_err(|reason| ConfigError::new(output_key, reason))?;
            }
            DeviceKind::Exit { .. } | DeviceKind::Hypercall { .. } | DeviceKind::MmioScratch { .. } | DeviceKind::VirtioNet { .. } => {}
        }
    }
    Ok(devices)
}

/// Files and sockets are created when the VM starts; their directory must exist already.
fn check_parent_directory(path: &Path) -> Result<(), String> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if parent.is_dir() {
        Ok(())
    } else {
        Err(format!("directory {} does not exist", parent.display()))
    }
}

fn check_socket_path(path: &Path) -> Result<(), String> {
    let length = path.as_os_str().len();
    if length > MAX_SOCKET_PATH {
        return Err(format!("{} is {length} bytes; a Unix socket path holds at most {MAX_SOCKET_PATH}", path.display()));
    }
    check_parent_directory(path)
}
