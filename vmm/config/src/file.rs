//! Reading the TOML file into a `Draft`. The document is walked by hand rather than through serde
//! so that every unknown key, wrong type and bad value is reported under its full dotted key.

use std::path::Path;

use toml::{Table, Value};

use crate::draft::{
    Draft, Setting, DEFAULT_CHANNEL_PORT, DEFAULT_CHANNEL_SIZE, DEFAULT_CHANNEL_VECTOR, DEFAULT_EXIT_PORT, DEFAULT_HYPERCALL_PORT,
    DEFAULT_SERIAL_IRQ, DEFAULT_SERIAL_PORT,
};
use hwspec::{parse_cpu_list, parse_size};

use crate::values::{parse_backing, parse_protocol, parse_serial_output, parse_smp, parse_unclaimed_ports, parse_watchdog};
use crate::{ConfigError, DeviceConfig, DeviceKind, SerialOutput};

/// The smallest channel: a header page and one page for each ring.
const MIN_CHANNEL_SIZE: u64 = 3 * 4096;
/// x86-64 physical addresses have at most 52 bits (MAXPHYADDR); TOML integers stop at 2^63, so
/// base + size cannot overflow before this check.
const MAX_GUEST_PHYSICAL_END: u64 = 1 << 52;
/// The IOAPIC KVM emulates has 24 pins.
const IOAPIC_PINS: i64 = 24;
/// Vectors 0..31 are CPU exceptions.
const FIRST_EXTERNAL_VECTOR: i64 = 32;

/// Where a virtio-net device's registers go by default: above 3 GiB, under the PCI hole's top.
pub(crate) const DEFAULT_VIRTIO_NET_BASE: u64 = 0xd000_0000;
pub(crate) const DEFAULT_VIRTIO_NET_IRQ: u32 = 5;
const DEVICE_KINDS: &str = "serial, exit, hypercall, channel, mmio-scratch, msr-scratch, virtio-net";

/// Reads and parses a configuration file; relative paths in it resolve against its directory.
pub(crate) fn read_file(path: &Path) -> Result<Draft, ConfigError> {
    let origin = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|error| ConfigError::new(&origin, format!("cannot read the configuration: {error}")))?;
    // `Path::new("vm.toml").parent()` is "", which keeps paths relative to the working directory.
    let base_dir = path.parent().unwrap_or(Path::new(""));
    parse_document(&text, base_dir, &origin)
}

/// Parses a whole document; `origin` names it in syntax errors (a path, or "config").
pub(crate) fn parse_document(text: &str, base_dir: &Path, origin: &str) -> Result<Draft, ConfigError> {
    let root: Table = toml::from_str(text).map_err(|error| syntax_error(text, origin, &error))?;
    reject_unknown_keys(&root, "", &["memory", "cpus", "boot", "watchdog", "control", "device"])?;
    let mut draft = Draft::default();

    if let Some(memory) = optional_table(&root, "memory")? {
        reject_unknown_keys(memory, "memory", &["size", "backing"])?;
        if let Some(value) = memory.get("size") {
            draft.memory_size = Setting::new(size_value(value, "memory.size")?, "memory.size");
        }
        if let Some(value) = memory.get("backing") {
            let backing =
                parse_backing(string_value(value, "memory.backing")?).map_err(|reason| ConfigError::new("memory.backing", reason))?;
            draft.backing = Setting::new(backing, "memory.backing");
        }
    }

    if let Some(cpus) = optional_table(&root, "cpus")? {
        reject_unknown_keys(cpus, "cpus", &["count", "cores"])?;
        if let Some(value) = cpus.get("count") {
            draft.cpu_count = Setting::new(unsigned_value(value, "cpus.count")?, "cpus.count");
        }
        if let Some(value) = cpus.get("cores") {
            // A list string as `--cores` takes it ("0-3"), or an array of core numbers.
            let cores = match value {
                Value::String(text) => parse_cpu_list(text).map_err(|error| ConfigError::new("cpus.cores", error.to_string()))?,
                Value::Array(array) => array
                    .iter()
                    .enumerate()
                    .map(|(index, core)| unsigned_value(core, &format!("cpus.cores[{index}]")).map(|core| core as usize))
                    .collect::<Result<Vec<usize>, ConfigError>>()?,
                other => return Err(type_error("cpus.cores", "an array or a CPU list string such as \"0-3\"", other)),
            };
            draft.cores = Some(Setting::new(cores, "cpus.cores"));
        }
    }

    if let Some(boot) = optional_table(&root, "boot")? {
        reject_unknown_keys(boot, "boot", &["kernel", "cmdline", "modules", "protocol", "smp", "unclaimed_ports"])?;
        if let Some(value) = boot.get("kernel") {
            let kernel = base_dir.join(string_value(value, "boot.kernel")?);
            draft.kernel = Some(Setting::new(kernel, "boot.kernel"));
        }
        if let Some(value) = boot.get("cmdline") {
            draft.cmdline = Setting::new(string_value(value, "boot.cmdline")?.to_string(), "boot.cmdline");
        }
        if let Some(value) = boot.get("modules") {
            for (index, module) in array_value(value, "boot.modules")?.iter().enumerate() {
                let key = format!("boot.modules[{index}]");
                let path = base_dir.join(string_value(module, &key)?);
                draft.modules.push(Setting::new(path, key));
            }
        }
        if let Some(value) = boot.get("protocol") {
            let protocol =
                parse_protocol(string_value(value, "boot.protocol")?).map_err(|reason| ConfigError::new("boot.protocol", reason))?;
            draft.protocol = Setting::new(protocol, "boot.protocol");
        }
        if let Some(value) = boot.get("smp") {
            draft.smp = parse_smp(string_value(value, "boot.smp")?).map_err(|reason| ConfigError::new("boot.smp", reason))?;
        }
        if let Some(value) = boot.get("unclaimed_ports") {
            draft.unclaimed_ports = parse_unclaimed_ports(string_value(value, "boot.unclaimed_ports")?)
                .map_err(|reason| ConfigError::new("boot.unclaimed_ports", reason))?;
        }
    }

    if let Some(watchdog) = optional_table(&root, "watchdog")? {
        reject_unknown_keys(watchdog, "watchdog", &["timeout"])?;
        if let Some(value) = watchdog.get("timeout") {
            draft.watchdog_ms =
                parse_watchdog(string_value(value, "watchdog.timeout")?).map_err(|reason| ConfigError::new("watchdog.timeout", reason))?;
        }
    }

    if let Some(control) = optional_table(&root, "control")? {
        reject_unknown_keys(control, "control", &["socket"])?;
        if let Some(value) = control.get("socket") {
            let socket = base_dir.join(string_value(value, "control.socket")?);
            draft.control_socket = Some(Setting::new(socket, "control.socket"));
        }
    }

    // An explicit `device = []` means no devices at all; only a file without the key gets the
    // default set.
    if let Some(value) = root.get("device") {
        let entries = array_value(value, "device")?;
        let mut devices: Vec<DeviceConfig> = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let table = entry.as_table().ok_or_else(|| type_error(&format!("device[{index}]"), "a table ([[device]])", entry))?;
            devices.push(parse_device(table, index, &devices, base_dir)?);
        }
        draft.devices = devices;
    }
    Ok(draft)
}

/// Parses one `[[device]]`; an unnamed device gets the first free `<kind><n>` after `earlier`.
fn parse_device(table: &Table, index: usize, earlier: &[DeviceConfig], base_dir: &Path) -> Result<DeviceConfig, ConfigError> {
    let position_key = format!("device[{index}]");
    let explicit_name = match table.get("name") {
        Some(value) => {
            let name = string_value(value, &format!("{position_key}.name"))?;
            check_device_name(name).map_err(|reason| ConfigError::new(format!("{position_key}.name"), reason))?;
            Some(name.to_string())
        }
        None => None,
    };
    // Errors about an unnamed device use its position: the user never wrote the generated name.
    let prefix = match &explicit_name {
        Some(name) => format!("device.{name}"),
        None => position_key,
    };
    let key = |name: &str| format!("{prefix}.{name}");

    let kind_name = match table.get("kind") {
        Some(value) => string_value(value, &key("kind"))?,
        None => return Err(ConfigError::new(key("kind"), format!("missing; every device needs a kind ({DEVICE_KINDS})"))),
    };
    let allowed_keys: &[&str] = match kind_name {
        "serial" => &["name", "kind", "port", "irq", "output"],
        "exit" | "hypercall" => &["name", "kind", "port"],
        "channel" => &["name", "kind", "size", "port", "vector"],
        "mmio-scratch" => &["name", "kind", "base", "size"],
        "msr-scratch" => &["name", "kind", "msrs"],
        "virtio-net" => &["name", "kind", "base", "irq", "tap", "host"],
        _ => return Err(ConfigError::new(key("kind"), format!("unknown device kind \"{kind_name}\" (kinds: {DEVICE_KINDS})"))),
    };
    if let Some(unknown) = table.keys().find(|name| !allowed_keys.contains(&name.as_str())) {
        return Err(ConfigError::new(
            key(unknown),
            format!("unknown key for a {kind_name} device (it takes: {})", allowed_keys.join(", ")),
        ));
    }

    let port = |default: u16| -> Result<u16, ConfigError> {
        match table.get("port") {
            Some(value) => ranged_value(value, &key("port"), 0, 0xffff).map(|port| port as u16),
            None => Ok(default),
        }
    };
    let kind = match kind_name {
        "serial" => DeviceKind::Serial {
            port: port(DEFAULT_SERIAL_PORT)?,
            irq: match table.get("irq") {
                Some(value) => ranged_value(value, &key("irq"), 0, IOAPIC_PINS - 1)? as u32,
                None => DEFAULT_SERIAL_IRQ,
            },
            output: match table.get("output") {
                Some(value) => parse_serial_output(string_value(value, &key("output"))?, base_dir)
                    .map_err(|reason| ConfigError::new(key("output"), reason))?,
                None => SerialOutput::Stdout,
            },
        },
        "exit" => DeviceKind::Exit { port: port(DEFAULT_EXIT_PORT)? },
        "hypercall" => DeviceKind::Hypercall { port: port(DEFAULT_HYPERCALL_PORT)? },
        "channel" => DeviceKind::Channel {
            size: match table.get("size") {
                Some(value) => {
                    let size = size_value(value, &key("size"))?;
                    check_channel_size(size).map_err(|reason| ConfigError::new(key("size"), reason))?;
                    size
                }
                None => DEFAULT_CHANNEL_SIZE,
            },
            doorbell_port: port(DEFAULT_CHANNEL_PORT)?,
            vector: match table.get("vector") {
                Some(value) => {
                    let vector = ranged_value(value, &key("vector"), 0, 255)?;
                    if vector < FIRST_EXTERNAL_VECTOR {
                        return Err(ConfigError::new(key("vector"), format!("{vector:#x} is a CPU exception vector; use 0x20..=0xff")));
                    }
                    vector as u8
                }
                None => DEFAULT_CHANNEL_VECTOR,
            },
        },
        "virtio-net" => DeviceKind::VirtioNet {
            base: match table.get("base") {
                Some(value) => unsigned_value(value, &key("base"))?,
                None => DEFAULT_VIRTIO_NET_BASE,
            },
            irq: match table.get("irq") {
                Some(value) => ranged_value(value, &key("irq"), 0, IOAPIC_PINS - 1)? as u32,
                None => DEFAULT_VIRTIO_NET_IRQ,
            },
            tap: match table.get("tap") {
                Some(value) => string_value(value, &key("tap"))?.to_string(),
                None => return Err(ConfigError::new(key("tap"), "missing; a virtio-net device needs the host tap's name")),
            },
            host: match table.get("host") {
                Some(value) => {
                    Some(parse_ipv4_prefix(string_value(value, &key("host"))?).map_err(|reason| ConfigError::new(key("host"), reason))?)
                }
                None => None,
            },
        },
        "mmio-scratch" => {
            let base = match table.get("base") {
                Some(value) => unsigned_value(value, &key("base"))?,
                None => return Err(ConfigError::new(key("base"), "missing; an mmio-scratch device needs a guest-physical base address")),
            };
            let size = match table.get("size") {
                Some(value) => size_value(value, &key("size"))?,
                None => 4096,
            };
            if size == 0 {
                return Err(ConfigError::new(key("size"), "must be more than 0"));
            }
            if base + size > MAX_GUEST_PHYSICAL_END {
                return Err(ConfigError::new(
                    key("size"),
                    format!("window {base:#x}..{:#x} ends past the 52-bit guest-physical address space", base + size),
                ));
            }
            DeviceKind::MmioScratch { base, size }
        }
        "msr-scratch" => {
            let values = match table.get("msrs") {
                Some(value) => array_value(value, &key("msrs"))?,
                None => {
                    return Err(ConfigError::new(key("msrs"), "missing; an msr-scratch device needs the list of MSR indices it handles"))
                }
            };
            if values.is_empty() {
                return Err(ConfigError::new(key("msrs"), "is empty; list at least one MSR index"));
            }
            let mut msrs: Vec<u32> = Vec::with_capacity(values.len());
            for (position, value) in values.iter().enumerate() {
                let msr = ranged_value(value, &format!("{}[{position}]", key("msrs")), 0, u32::MAX as i64)? as u32;
                if msrs.contains(&msr) {
                    return Err(ConfigError::new(key("msrs"), format!("lists MSR {msr:#x} twice")));
                }
                msrs.push(msr);
            }
            DeviceKind::MsrScratch { msrs }
        }
        _ => unreachable!("the kind was checked against the same list above"),
    };

    let name = explicit_name.unwrap_or_else(|| {
        let taken = |name: &str| earlier.iter().any(|device| device.name == name);
        let mut number = earlier.iter().filter(|device| device.kind.kind_name() == kind_name).count();
        while taken(&format!("{kind_name}{number}")) {
            number += 1;
        }
        format!("{kind_name}{number}")
    });
    Ok(DeviceConfig { name, kind })
}

/// Device names appear in keys (`device.NAME.port`) and log lines, so they stay plain.
fn check_device_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".to_string());
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("\"{name}\" may only contain letters, digits, '-' and '_'"));
    }
    Ok(())
}

fn check_channel_size(size: u64) -> Result<(), String> {
    if size % 4096 != 0 {
        return Err(format!("{size:#x} is not a multiple of 4 KiB"));
    }
    if size < MIN_CHANNEL_SIZE {
        return Err(format!("{size:#x} is too small: a header page and a page per ring need at least 12 KiB"));
    }
    Ok(())
}

/// One-line syntax error with the position: toml's own message spans several lines.
fn syntax_error(text: &str, origin: &str, error: &toml::de::Error) -> ConfigError {
    let message = error.message().trim().replace('\n', " ");
    let reason = match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
            format!("TOML syntax error at line {line}, column {column}: {message}")
        }
        None => format!("TOML syntax error: {message}"),
    };
    ConfigError::new(origin, reason)
}

fn join_key(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn reject_unknown_keys(table: &Table, prefix: &str, allowed: &[&str]) -> Result<(), ConfigError> {
    match table.keys().find(|name| !allowed.contains(&name.as_str())) {
        Some(unknown) => {
            let scope = if prefix.is_empty() { "the file".to_string() } else { format!("[{prefix}]") };
            Err(ConfigError::new(join_key(prefix, unknown), format!("unknown key ({scope} takes: {})", allowed.join(", "))))
        }
        None => Ok(()),
    }
}

fn optional_table<'a>(root: &'a Table, name: &str) -> Result<Option<&'a Table>, ConfigError> {
    match root.get(name) {
        Some(Value::Table(table)) => Ok(Some(table)),
        Some(other) => Err(type_error(name, "a table", other)),
        None => Ok(None),
    }
}

/// "expected a string, found integer 5": the value is shown when it is short enough to help.
fn type_error(key: &str, expected: &str, found: &Value) -> ConfigError {
    let shown = match found {
        Value::String(_) | Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => {
            format!("{} {found}", found.type_str())
        }
        _ => found.type_str().to_string(),
    };
    ConfigError::new(key, format!("expected {expected}, found {shown}"))
}

/// `A.B.C.D/N`.
pub(crate) fn parse_ipv4_prefix(text: &str) -> Result<(std::net::Ipv4Addr, u8), String> {
    let bad = || format!("\"{text}\" is not an IPv4 address with a prefix length (10.0.0.1/24)");
    let (addr, prefix) = text.split_once('/').ok_or_else(bad)?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    if prefix > 32 {
        return Err(bad());
    }
    Ok((addr.parse().map_err(|_| bad())?, prefix))
}

fn string_value<'a>(value: &'a Value, key: &str) -> Result<&'a str, ConfigError> {
    value.as_str().ok_or_else(|| type_error(key, "a string", value))
}

fn array_value<'a>(value: &'a Value, key: &str) -> Result<&'a Vec<Value>, ConfigError> {
    value.as_array().ok_or_else(|| type_error(key, "an array", value))
}

fn ranged_value(value: &Value, key: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
    let number = value.as_integer().ok_or_else(|| type_error(key, "an integer", value))?;
    if number < min || number > max {
        return Err(ConfigError::new(key, format!("{number} is out of range {min:#x}..={max:#x}")));
    }
    Ok(number)
}

fn unsigned_value(value: &Value, key: &str) -> Result<u64, ConfigError> {
    ranged_value(value, key, 0, i64::MAX).map(|number| number as u64)
}

/// A size is an integer byte count or a string with a suffix ("64M").
fn size_value(value: &Value, key: &str) -> Result<u64, ConfigError> {
    match value {
        Value::String(text) => parse_size(text).map_err(|error| ConfigError::new(key, error.to_string())),
        Value::Integer(_) => unsigned_value(value, key),
        other => Err(type_error(key, "a size (bytes, or a string such as \"64M\")", other)),
    }
}
