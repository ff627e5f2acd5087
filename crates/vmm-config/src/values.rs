//! Text forms shared by the TOML file and the command line (`64M`, `5s`, `2m`, `file:PATH`, ...),
//! so both accept exactly the same spellings. Each parser returns only the reason; the caller
//! knows the key or flag to report it under.

use std::path::Path;

use crate::{Backing, BootProtocol, SerialOutput, SmpStart, UnclaimedPorts};

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const TIB: u64 = 1 << 40;

/// Parses a byte count: `4096`, `64K`, `64M`, `2G`, `1T` (binary multiples; `KiB`/`MiB`/... and
/// lower case are accepted too).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let not_a_size = || {
        format!("\"{text}\" is not a size (expected bytes or a number with a K, M, G or T suffix, e.g. \"64M\")")
    };
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    let multiplier = match suffix.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        _ => return Err(not_a_size()),
    };
    let number: u64 = digits.parse().map_err(|_| not_a_size())?;
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("\"{text}\" is too large"))
}

/// Renders a byte count the way a user would write it ("64 MiB", "12345 bytes").
pub(crate) fn describe_size(bytes: u64) -> String {
    for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}

/// The shortest suffix form `parse_size` reads back ("64M", "4097").
pub(crate) fn size_literal(bytes: u64) -> String {
    for (unit, suffix) in [(TIB, "T"), (GIB, "G"), (MIB, "M"), (KIB, "K")] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

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
        return Err(format!(
            "\"{text}\" needs a unit: ms or s (e.g. \"5s\"), or \"off\""
        ));
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("\"{text}\" is not a duration (e.g. \"500ms\", \"5s\" or \"off\")"))?;
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
        _ => Err(format!(
            "\"{text}\" is not a backing (expected \"4k\" or \"2m\")"
        )),
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
        _ => Err(format!(
            "\"{text}\" is not a boot protocol (expected auto, pvh, direct64 or linux)"
        )),
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
        _ => Err(format!(
            "\"{text}\" is not an SMP start (expected direct or sipi)"
        )),
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
                Err(format!(
                    "\"{text}\" is not a serial output (expected stdout, null, file:PATH or unix:PATH)"
                ))
            }
        }
    }
}

/// Parses a CPU list as sysfs and `taskset -c` write it ("0-3,8,10-11"), keeping the order given
/// (for `--cores` the position is the vCPU index).
pub(crate) fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for item in text.trim().split(',') {
        let bad_item =
            || format!("\"{item}\" is not a core number or range (e.g. \"0,1\" or \"0-3\")");
        match item.split_once('-') {
            Some((first, last)) => {
                let first: usize = first.parse().map_err(|_| bad_item())?;
                let last: usize = last.parse().map_err(|_| bad_item())?;
                if first > last {
                    return Err(bad_item());
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(item.parse().map_err(|_| bad_item())?),
        }
    }
    Ok(cpus)
}

/// Renders sorted CPU numbers compactly ("0-3,8").
pub(crate) fn describe_cpu_list(sorted_cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut index = 0;
    while index < sorted_cpus.len() {
        let first = sorted_cpus[index];
        let mut last = first;
        while index + 1 < sorted_cpus.len() && sorted_cpus[index + 1] == last + 1 {
            index += 1;
            last = sorted_cpus[index];
        }
        parts.push(if first == last {
            first.to_string()
        } else {
            format!("{first}-{last}")
        });
        index += 1;
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_bytes_and_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 * KIB));
        assert_eq!(parse_size("64m"), Ok(64 * MIB));
        assert_eq!(parse_size("2GiB"), Ok(2 * GIB));
        assert_eq!(parse_size("1T"), Ok(TIB));
        assert!(parse_size("64MB").unwrap_err().contains("not a size"));
        assert!(parse_size("M").unwrap_err().contains("not a size"));
        assert!(parse_size("-1").unwrap_err().contains("not a size"));
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn sizes_render_in_the_largest_exact_unit() {
        assert_eq!(describe_size(64 * MIB), "64 MiB");
        assert_eq!(describe_size(3 * GIB + 512 * MIB), "3584 MiB");
        assert_eq!(describe_size(4097), "4097 bytes");
        assert_eq!(size_literal(2 * GIB), "2G");
        assert_eq!(size_literal(12 * KIB), "12K");
        assert_eq!(size_literal(100), "100");
    }

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
        assert_eq!(
            parse_serial_output("stdout", base),
            Ok(SerialOutput::Stdout)
        );
        assert_eq!(parse_serial_output("null", base), Ok(SerialOutput::Null));
        assert_eq!(
            parse_serial_output("file:log/com1.txt", base),
            Ok(SerialOutput::File("/etc/vms/log/com1.txt".into()))
        );
        assert_eq!(
            parse_serial_output("unix:/run/s.sock", base),
            Ok(SerialOutput::UnixSocket("/run/s.sock".into()))
        );
        assert!(parse_serial_output("file:", base)
            .unwrap_err()
            .contains("no path"));
        assert!(parse_serial_output("tcp:1", base)
            .unwrap_err()
            .contains("not a serial output"));
    }

    #[test]
    fn cpu_lists_keep_order_and_render_as_ranges() {
        assert_eq!(parse_cpu_list("3,1"), Ok(vec![3, 1]));
        assert_eq!(parse_cpu_list("0-3,8\n"), Ok(vec![0, 1, 2, 3, 8]));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert_eq!(describe_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(describe_cpu_list(&[]), "none");
    }
}
