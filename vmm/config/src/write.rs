//! Writing a configuration back in the file format, so the configuration in force (file plus
//! flags) can be logged, reported or saved and read again.

use std::fmt::Write;
use std::path::Path;

use hwspec::format_size;

use crate::values::{backing_name, protocol_name, smp_name, unclaimed_ports_name};
use crate::{DeviceKind, SerialOutput, VmConfig};

/// A TOML string literal, escaped.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn quoted_path(path: &Path) -> String {
    quoted(&path.to_string_lossy())
}

impl VmConfig {
    /// The configuration in the file format; `from_toml_str` reads it back to an equal
    /// `VmConfig` (paths are written as they are, so use absolute paths or the same base
    /// directory). Pinning is written only when every vCPU is pinned, as the file cannot express
    /// a mix, and paths that are not UTF-8 are written lossily.
    pub fn to_toml_string(&self) -> String {
        let mut out = String::new();
        // Top-level keys must precede the first table.
        if self.devices.is_empty() {
            out.push_str("device = []\n\n");
        }
        let _ = writeln!(out, "[memory]\nsize = \"{}\"", format_size(self.memory.size));
        let _ = writeln!(out, "backing = \"{}\"\n", backing_name(self.memory.backing));

        let _ = writeln!(out, "[cpus]\ncount = {}", self.vcpus.len());
        let cores: Option<Vec<String>> = self.vcpus.iter().map(|vcpu| vcpu.host_core.map(|core| core.to_string())).collect();
        if let Some(cores) = cores {
            let _ = writeln!(out, "cores = [{}]", cores.join(", "));
        }

        let boot = &self.boot;
        let _ = writeln!(out, "\n[boot]\nkernel = {}", quoted_path(&boot.kernel));
        let _ = writeln!(out, "cmdline = {}", quoted(&boot.cmdline));
        let modules: Vec<String> = boot.modules.iter().map(|module| quoted_path(module)).collect();
        let _ = writeln!(out, "modules = [{}]", modules.join(", "));
        let _ = writeln!(out, "protocol = \"{}\"", protocol_name(boot.protocol));
        let _ = writeln!(out, "smp = \"{}\"", smp_name(boot.smp));
        let _ = writeln!(out, "unclaimed_ports = \"{}\"", unclaimed_ports_name(boot.unclaimed_ports));

        if let Some(millis) = self.watchdog_ms {
            let timeout = if millis % 1000 == 0 { format!("{}s", millis / 1000) } else { format!("{millis}ms") };
            let _ = writeln!(out, "\n[watchdog]\ntimeout = \"{timeout}\"");
        }
        if let Some(socket) = &self.control_socket {
            let _ = writeln!(out, "\n[control]\nsocket = {}", quoted_path(socket));
        }

        for device in &self.devices {
            let _ = writeln!(out, "\n[[device]]\nname = {}", quoted(&device.name));
            let _ = writeln!(out, "kind = \"{}\"", device.kind.kind_name());
            match &device.kind {
                DeviceKind::Serial { port, irq, output } => {
                    let output = match output {
                        SerialOutput::Stdout => "stdout".to_string(),
                        SerialOutput::Null => "null".to_string(),
                        SerialOutput::File(path) => format!("file:{}", path.to_string_lossy()),
                        SerialOutput::UnixSocket(path) => {
                            format!("unix:{}", path.to_string_lossy())
                        }
                    };
                    let _ = writeln!(out, "port = {port:#x}\nirq = {irq}\noutput = {}", quoted(&output));
                }
                DeviceKind::Exit { port } | DeviceKind::Hypercall { port } => {
                    let _ = writeln!(out, "port = {port:#x}");
                }
                DeviceKind::Channel { size, doorbell_port, vector } => {
                    let _ = writeln!(out, "size = \"{}\"\nport = {doorbell_port:#x}\nvector = {vector:#x}", format_size(*size));
                }
                DeviceKind::MmioScratch { base, size } => {
                    let _ = writeln!(out, "base = {base:#x}\nsize = {size:#x}");
                }
                DeviceKind::VirtioNet { base, irq, tap, host } => {
                    let _ = writeln!(out, "base = {base:#x}\nirq = {irq}\ntap = {}", quoted(tap));
                    if let Some((addr, prefix)) = host {
                        let _ = writeln!(out, "host = \"{addr}/{prefix}\"");
                    }
                }
                DeviceKind::MsrScratch { msrs } => {
                    let msrs: Vec<String> = msrs.iter().map(|msr| format!("{msr:#x}")).collect();
                    let _ = writeln!(out, "msrs = [{}]", msrs.join(", "));
                }
            }
        }
        out
    }
}
