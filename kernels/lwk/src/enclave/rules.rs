//! The enclave's decisions that need no machine: which paths go to the host, how the channel
//! is described on the command line, how output is cut into messages. Plain `core` code with
//! no crate dependencies, so that `test.sh` compiles this file alone as a host test program
//! (`rustc --test`): the kernel itself cannot run `cargo test`.

/// Which paths the host serves: relative ones (to the job's working directory) and absolute
/// ones under `cwd`; everything else is the job's in-memory file system.
pub fn is_forwarded(path: &str, cwd: &str) -> bool {
    if path.is_empty() {
        return false;
    }
    if !path.starts_with('/') {
        return true;
    }
    let cwd = cwd.trim_end_matches('/');
    match path.strip_prefix(cwd) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || cwd.is_empty(),
        None => false,
    }
}

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

/// The status a shell shows for a job ended by `signal`.
pub fn status_for_signal(signal: u32) -> u32 {
    128 + (signal & 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_and_paths_under_the_working_directory_are_forwarded() {
        assert!(is_forwarded("out.txt", "/home/user/run"));
        assert!(is_forwarded("sub/out.txt", "/home/user/run"));
        assert!(is_forwarded("../escape", "/home/user/run"), "the host refuses it, not the kernel");
        assert!(is_forwarded("/home/user/run/out.txt", "/home/user/run"));
        assert!(is_forwarded("/home/user/run/out.txt", "/home/user/run/"));
        assert!(is_forwarded("/home/user/run", "/home/user/run"));
        assert!(is_forwarded("/anything", "/"), "a job started in / forwards every absolute path");
    }

    #[test]
    fn other_absolute_paths_stay_in_the_enclave() {
        assert!(!is_forwarded("/etc/passwd", "/home/user/run"));
        assert!(!is_forwarded("/home/user/runner/x", "/home/user/run"), "a prefix is not a parent");
        assert!(!is_forwarded("/proc/self/exe", "/home/user/run"));
        assert!(!is_forwarded("", "/home/user/run"));
    }

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
        assert_eq!(status_for_signal(9), 137);
        assert_eq!(status_for_signal(15), 143);
    }
}
