//! The persistent enclave's decisions that need no machine: how the channel is described on
//! the command line, which stream a descriptor's output is, a killed job's status.

/// A hexadecimal number as the VMM writes them (`0x` optional).
pub fn parse_hex(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// `clowder.channel=<gpa>,<size>`: the region's guest-physical start and size, page aligned
/// and at least the channel's minimum of three pages.
pub fn parse_channel_region(value: &str) -> Option<(u64, u64)> {
    let (start, size) = value.split_once(',')?;
    let (start, size) = (parse_hex(start)?, parse_hex(size)?);
    (start % 4096 == 0 && size % 4096 == 0 && size >= 3 * 4096).then_some((start, size))
}

/// The stream a console write goes to: descriptor 2 is stderr, the others stdout.
pub fn is_stderr(descriptor: u64) -> bool {
    descriptor as u32 == 2
}

/// `JobExited`'s status for a job ended by `signal` (enclave-proto's `KILLED_BY_SIGNAL` + N: an
/// exit code is 0..=255).
pub fn status_for_signal(signal: u32) -> u32 {
    0x100 + (signal & 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_regions_parse_as_the_vmm_writes_them() {
        assert_eq!(parse_channel_region("0xfff0000,0x10000"), Some((0xfff_0000, 0x10000)));
        assert_eq!(parse_channel_region("fff0000,10000"), Some((0xfff_0000, 0x10000)));
        assert_eq!(parse_channel_region("0xfff0000"), None);
        assert_eq!(parse_channel_region("0xfff0001,0x10000"), None, "not page aligned");
        assert_eq!(parse_channel_region("0xfff0000,0x1000"), None, "smaller than three pages");
        assert_eq!(parse_channel_region("0x,0x10000"), None);
        assert_eq!(parse_channel_region("zz,0x10000"), None);
        assert_eq!(parse_hex("0x40"), Some(0x40));
        assert_eq!(parse_hex("520"), Some(0x520));
    }

    #[test]
    fn streams_and_signal_statuses() {
        assert!(is_stderr(2));
        assert!(!is_stderr(1));
        assert!(is_stderr(0xffff_ffff_0000_0002), "descriptors are C ints");
        assert_eq!(status_for_signal(9), 0x109);
        assert_eq!(status_for_signal(15), 0x10f);
    }
}
