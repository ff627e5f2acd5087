//! Text forms shared by the TOML file and the command line (`5s`, `2m`, `file:PATH`, ...), so
//! both accept exactly the same spellings. Each parser returns only the reason; the caller
//! knows the key or flag to report it under. Sizes and CPU lists are `hwspec`'s, as everywhere
//! in clowder.

use std::path::Path;

use crate::{Backing, BootProtocol, SerialOutput, SmpStart, UnclaimedPorts};

/// Parses a watchdog timeout: `500ms`, `5s`, or `off` (no watchdog, `None`).
pub(crate) fn parse_watchdog(text: &str) -> Result<Option<u64>, String> {
    if text == "off" {
        return Ok(None);
    }
    let (digits, multiplier) = if let Some(digits) = text.strip_suffix("ms") {
        (digits, 1)
    } else if let Some(digits) = text.strip_suffix('s') {
        (digits, 1000)
    } else {
        return Err(format!("\"{text}\" needs a unit: ms or s (e.g. \"5s\"), or \"off\""));
    };
    let number: u64 = digits.parse().map_err(|_| format!("\"{text}\" is not a duration (e.g. \"500ms\", \"5s\" or \"off\")"))?;
    match number.checked_mul(multiplier) {
        Some(0) => Err("must be longer than 0 (use \"off\" for no watchdog)".to_string()),
        Some(millis) => Ok(Some(millis)),
        None => Err(format!("\"{text}\" is too long")),
    }
}

pub(crate) fn parse_backing(text: &str) -> Result<Backing, String> {
    match text.to_ascii_lowercase().as_str() {
        "4k" => Ok(Backing::Page4K),
        "2m" => Ok(Backing::Huge2M),
        _ => Err(format!("\"{text}\" is not a backing (expected \"4k\" or \"2m\")")),
    }
}

pub(crate) fn backing_name(backing: Backing) -> &'static str {
    match backing {
        Backing::Page4K => "4k",
        Backing::Huge2M => "2m",
    }
}

pub(crate) fn parse_protocol(text: &str) -> Result<BootProtocol, String> {
    match text {
        "auto" => Ok(BootProtocol::Auto),
        "pvh" => Ok(BootProtocol::Pvh),
        "direct64" => Ok(BootProtocol::Direct64),
        "linux" => Ok(BootProtocol::Linux),
        _ => Err(format!("\"{text}\" is not a boot protocol (expected auto, pvh, direct64 or linux)")),
    }
}

pub(crate) fn protocol_name(protocol: BootProtocol) -> &'static str {
    match protocol {
        BootProtocol::Auto => "auto",
        BootProtocol::Pvh => "pvh",
        BootProtocol::Direct64 => "direct64",
        BootProtocol::Linux => "linux",
    }
}

pub(crate) fn parse_smp(text: &str) -> Result<SmpStart, String> {
    match text {
        "direct" => Ok(SmpStart::Direct),
        "sipi" => Ok(SmpStart::Sipi),
        _ => Err(format!("\"{text}\" is not an SMP start (expected direct or sipi)")),
    }
}

pub(crate) fn parse_unclaimed_ports(text: &str) -> Result<UnclaimedPorts, String> {
    match text {
        "auto" => Ok(UnclaimedPorts::Auto),
        "fail" => Ok(UnclaimedPorts::Fail),
        "log" => Ok(UnclaimedPorts::Log),
        _ => Err(format!("\"{text}\" is not a policy for unclaimed ports (expected auto, fail or log)")),
    }
}

pub(crate) fn unclaimed_ports_name(policy: UnclaimedPorts) -> &'static str {
    match policy {
        UnclaimedPorts::Auto => "auto",
        UnclaimedPorts::Fail => "fail",
        UnclaimedPorts::Log => "log",
    }
}

pub(crate) fn smp_name(smp: SmpStart) -> &'static str {
    match smp {
        SmpStart::Direct => "direct",
        SmpStart::Sipi => "sipi",
    }
}

/// Parses `stdout`, `null`, `file:PATH` or `unix:PATH`; relative paths resolve against
/// `base_dir`.
pub(crate) fn parse_serial_output(text: &str, base_dir: &Path) -> Result<SerialOutput, String> {
    let nonempty_path = |path: &str| {
        if path.is_empty() {
            Err(format!("\"{text}\" has no path after the colon"))
        } else {
            Ok(base_dir.join(path))
        }
    };
    match text {
        "stdout" => Ok(SerialOutput::Stdout),
        "null" => Ok(SerialOutput::Null),
        _ => {
            if let Some(path) = text.strip_prefix("file:") {
                nonempty_path(path).map(SerialOutput::File)
            } else if let Some(path) = text.strip_prefix("unix:") {
                nonempty_path(path).map(SerialOutput::UnixSocket)
            } else {
                Err(format!("\"{text}\" is not a serial output (expected stdout, null, file:PATH or unix:PATH)"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_takes_ms_s_or_off() {
        assert_eq!(parse_watchdog("500ms"), Ok(Some(500)));
        assert_eq!(parse_watchdog("5s"), Ok(Some(5000)));
        assert_eq!(parse_watchdog("off"), Ok(None));
        assert!(parse_watchdog("5").unwrap_err().contains("needs a unit"));
        assert!(parse_watchdog("5m").unwrap_err().contains("needs a unit"));
        assert!(parse_watchdog("xs").unwrap_err().contains("not a duration"));
        assert!(parse_watchdog("0s").unwrap_err().contains("longer than 0"));
    }

    #[test]
    fn serial_outputs_resolve_relative_paths() {
        let base = Path::new("/etc/vms");
        assert_eq!(parse_serial_output("stdout", base), Ok(SerialOutput::Stdout));
        assert_eq!(parse_serial_output("null", base), Ok(SerialOutput::Null));
        assert_eq!(parse_serial_output("file:log/com1.txt", base), Ok(SerialOutput::File("/etc/vms/log/com1.txt".into())));
        assert_eq!(parse_serial_output("unix:/run/s.sock", base), Ok(SerialOutput::UnixSocket("/run/s.sock".into())));
        assert!(parse_serial_output("file:", base).unwrap_err().contains("no path"));
        assert!(parse_serial_output("tcp:1", base).unwrap_err().contains("not a serial output"));
    }
}
