//! The `clowder-vmm` command line: `--config FILE` first, then flags that override it. Parsed by
//! hand so that flag errors look exactly like file errors (`--mem: "6x" is not a size ...`).

use std::path::{Path, PathBuf};

use crate::draft::{Draft, Setting};
use crate::file::{parse_ipv4_prefix, read_file, DEFAULT_VIRTIO_NET_BASE, DEFAULT_VIRTIO_NET_IRQ};
use crate::{DeviceConfig, DeviceKind};
use hwspec::{parse_cpu_list, parse_size};

use crate::values::{parse_backing, parse_protocol, parse_serial_output, parse_smp, parse_unclaimed_ports, parse_watchdog};
use crate::ConfigError;

/// The `--help` text of `clowder-vmm`.
pub const USAGE: &str = "\
Usage: clowder-vmm [--config FILE] [FLAG VALUE]...

Runs one KVM virtual machine. Flags override the values in --config FILE.

  --config FILE      TOML configuration, loaded first wherever it appears
  --kernel PATH      kernel image: ELF64 x86-64 (PVH or 64-bit entry) or bzImage
  --mem SIZE         guest RAM, e.g. 64M or 4G (default 128M)
  --backing 4k|2m    pages backing guest RAM; 2m needs free hugepages (vm.nr_hugepages)
  --cpus N           number of vCPUs, 1 to 255 (default 1)
  --cores LIST       host core of each vCPU in order, e.g. 0,1 or 2-5 (default: unpinned)
  --cmdline TEXT     kernel command line (the VMM appends clowder.* keys)
  --cmdline-file PATH  the kernel command line read from PATH (a private file or
                     /proc/PID/fd/N), so that it is not on this process's command line,
                     which every user can read
  --module PATH      boot module, the initrd for a bzImage; repeatable, replaces the file's list
  --protocol P       auto, pvh, direct64 or linux (default auto)
  --smp S            direct (every vCPU starts at the entry) or sipi (default direct)
  --unclaimed-ports P  port I/O no device claims: fail, log (once per port) or auto
                     (default auto: log for Linux guests, fail for others)
  --serial OUT       output of the first serial port: stdout, null, file:PATH or unix:PATH
  --watchdog T       stop the VM after T without an exit, e.g. 500ms or 5s, or off
  --control PATH     Unix socket for control requests (pause, resume, stop, stats, channel)
  --net TAP[,A.B.C.D/N]  adds a virtio-net device (\"net0\", virtio-mmio at the default base
                     and IRQ) over the host tap TAP, made by the VMM and gone with it; with
                     an address, the tap's host end gets it and is brought up
  -h, --help         print this help

Every flag also accepts --flag=VALUE.

Environment:
  CLOWDER_LOG        which diagnostics are printed: error, warn, info (the default), debug or
                     trace, and NAME=LEVEL for one part (clowder-vmm=debug)
";

/// Flags taking a value, each with an example for the \"needs a value\" error.
const FLAGS: &[(&str, &str)] = &[
    ("--config", "vm.toml"),
    ("--kernel", "kernel.elf"),
    ("--mem", "64M"),
    ("--backing", "2m"),
    ("--cpus", "2"),
    ("--cores", "0,1"),
    ("--cmdline", "\"console=ttyS0\""),
    ("--cmdline-file", "/run/clowder/vm0.cmdline"),
    ("--module", "initrd.img"),
    ("--protocol", "pvh"),
    ("--smp", "sipi"),
    ("--unclaimed-ports", "log"),
    ("--serial", "file:vm.log"),
    ("--watchdog", "5s"),
    ("--control", "/run/clowder/vm0.sock"),
    ("--net", "clw-vm0,10.77.0.1/30"),
];

pub(crate) fn draft_from_args(args: &[String]) -> Result<Draft, ConfigError> {
    // Help wins over every other problem on the line, as users expect of --help.
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        return Err(ConfigError::help_request());
    }
    let given = collect_flags(args)?;
    if given.iter().any(|(flag, _)| *flag == "--cmdline") && given.iter().any(|(flag, _)| *flag == "--cmdline-file") {
        return Err(ConfigError::new("--cmdline-file", "cannot be given with --cmdline: choose one"));
    }
    let mut draft = match given.iter().find(|(flag, _)| *flag == "--config") {
        Some((_, path)) => read_file(Path::new(path))?,
        None => Draft::default(),
    };

    let mut modules_replaced = false;
    for (flag, value) in &given {
        let flag = *flag;
        let invalid = |reason: String| ConfigError::new(flag, reason);
        match flag {
            "--config" => {}
            "--kernel" => draft.kernel = Some(Setting::new(PathBuf::from(value), flag)),
            "--mem" => draft.memory_size = Setting::new(parse_size(value).map_err(|e| invalid(e.to_string()))?, flag),
            "--backing" => draft.backing = Setting::new(parse_backing(value).map_err(invalid)?, flag),
            "--cpus" => {
                let count = value.parse().map_err(|_| invalid(format!("\"{value}\" is not a vCPU count")))?;
                draft.cpu_count = Setting::new(count, flag);
            }
            "--cores" => draft.cores = Some(Setting::new(parse_cpu_list(value).map_err(|e| invalid(e.to_string()))?, flag)),
            "--cmdline" => draft.cmdline = Setting::new(value.clone(), flag),
            "--cmdline-file" => {
                let text = std::fs::read_to_string(value).map_err(|e| invalid(format!("cannot read {value}: {e}")))?;
                // A file written by hand ends with a newline that is no part of the line.
                let line = text.strip_suffix('\n').unwrap_or(&text);
                draft.cmdline = Setting::new(line.to_string(), flag);
            }
            "--module" => {
                // The first --module replaces the file's list; the later ones add to it.
                if !modules_replaced {
                    draft.modules.clear();
                    modules_replaced = true;
                }
                draft.modules.push(Setting::new(PathBuf::from(value), flag));
            }
            "--protocol" => draft.protocol = Setting::new(parse_protocol(value).map_err(invalid)?, flag),
            "--smp" => draft.smp = parse_smp(value).map_err(invalid)?,
            "--unclaimed-ports" => draft.unclaimed_ports = parse_unclaimed_ports(value).map_err(invalid)?,
            "--serial" => {
                // Relative paths stay relative to the working directory.
                let output = parse_serial_output(value, Path::new("")).map_err(invalid)?;
                draft.serial_output_override = Some(Setting::new(output, flag));
            }
            "--watchdog" => draft.watchdog_ms = parse_watchdog(value).map_err(invalid)?,
            "--control" => draft.control_socket = Some(Setting::new(PathBuf::from(value), flag)),
            "--net" => draft.devices.push(net_device(value).map_err(invalid)?),
            _ => unreachable!("collect_flags only returns flags from FLAGS"),
        }
    }
    Ok(draft)
}

/// `--net TAP[,A.B.C.D/N]`: a virtio-net device beside the file's (or the default) devices, so
/// a caller adds a network without restating the devices every guest needs.
fn net_device(value: &str) -> Result<DeviceConfig, String> {
    let (tap, host) = match value.split_once(',') {
        Some((tap, host)) => (tap, Some(parse_ipv4_prefix(host)?)),
        None => (value, None),
    };
    if tap.is_empty() {
        return Err(format!("\"{value}\" names no tap; expected TAP or TAP,A.B.C.D/N"));
    }
    let kind = DeviceKind::VirtioNet { base: DEFAULT_VIRTIO_NET_BASE, irq: DEFAULT_VIRTIO_NET_IRQ, tap: tap.to_string(), host };
    Ok(DeviceConfig { name: "net0".to_string(), kind })
}

/// Splits the arguments into (flag, value) pairs, refusing unknown flags, missing values and
/// repeated flags (only `--module` repeats).
fn collect_flags(args: &[String]) -> Result<Vec<(&'static str, String)>, ConfigError> {
    let mut given: Vec<(&'static str, String)> = Vec::new();
    let mut remaining = args.iter();
    while let Some(arg) = remaining.next() {
        let (name, inline_value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg.as_str(), None),
        };
        let Some(&(flag, example)) = FLAGS.iter().find(|(flag, _)| *flag == name) else {
            let reason = if name.starts_with('-') {
                "unknown flag (clowder-vmm --help lists them)"
            } else {
                "unexpected argument: every value follows its flag (clowder-vmm --help lists them)"
            };
            return Err(ConfigError::new(name, reason));
        };
        let value = match inline_value {
            Some(value) => value.to_string(),
            // A following flag means the value was forgotten; only a command line may start with
            // dashes.
            None => match remaining.next() {
                Some(value) if flag == "--cmdline" || !value.starts_with("--") => value.clone(),
                _ => return Err(ConfigError::new(flag, format!("needs a value, e.g. {flag} {example}"))),
            },
        };
        if flag != "--module" && given.iter().any(|(earlier, _)| *earlier == flag) {
            return Err(ConfigError::new(flag, "is given more than once"));
        }
        given.push((flag, value));
    }
    Ok(given)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_command_line_can_come_from_a_file() {
        let path = std::env::temp_dir().join(format!("vmm-config-cmdline-{}", std::process::id()));
        std::fs::write(&path, "lwk.env=TOKEN=secret -- \"job\"\n").unwrap();
        let file = path.to_str().unwrap();
        let draft = draft_from_args(&args(&["--cmdline-file", file])).unwrap();
        assert_eq!(draft.cmdline.value, "lwk.env=TOKEN=secret -- \"job\"");
        let both = draft_from_args(&args(&["--cmdline", "x", "--cmdline-file", file])).unwrap_err();
        assert!(both.to_string().contains("cannot be given with --cmdline"), "{both}");
        std::fs::remove_file(&path).unwrap();
        let missing = draft_from_args(&args(&["--cmdline-file", file])).unwrap_err();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
    }

    /// `--net` adds to the devices every guest gets (a file's `[[device]]` list replaces them),
    /// and a bad value is refused in one line naming the flag.
    #[test]
    fn a_network_is_added_beside_the_default_devices() {
        let draft = draft_from_args(&args(&["--net", "clw-vm0,10.77.0.1/30"])).unwrap();
        assert_eq!(draft.devices.len(), crate::draft::default_devices().len() + 1);
        let host = Some(("10.77.0.1".parse().unwrap(), 30));
        let net = DeviceKind::VirtioNet { base: DEFAULT_VIRTIO_NET_BASE, irq: DEFAULT_VIRTIO_NET_IRQ, tap: "clw-vm0".into(), host };
        assert_eq!(draft.devices.last(), Some(&DeviceConfig { name: "net0".into(), kind: net }));
        let bare = draft_from_args(&args(&["--net=clw-vm1"])).unwrap();
        assert!(matches!(&bare.devices.last().unwrap().kind, DeviceKind::VirtioNet { host: None, .. }));
        for bad in [",10.0.0.1/24", "t,10.0.0.1", "t,10.0.0.1/40"] {
            let error = draft_from_args(&args(&["--net", bad])).unwrap_err().to_string();
            assert!(error.starts_with("--net"), "{bad}: {error}");
        }
    }
}
