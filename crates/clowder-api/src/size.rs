//! How sizes are written for people: the daemon's `ls` and the CLI's tables.

/// A size exactly, with the largest binary suffix that divides it (`1G`, `3M`, `1000`).
pub fn format_size(bytes: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1u64 << shift) == 0 {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Exact sizes as people write them (`64K`, `1G`); others, such as a whole-address-space
/// segment (128 TiB minus a page), rounded to one decimal so a table stays readable.
pub fn readable_size(bytes: u64) -> String {
    let Some((shift, suffix)) = [(40, "T"), (30, "G"), (20, "M"), (10, "K")].into_iter().find(|(shift, _)| bytes >= 1u64 << shift)
    else {
        return bytes.to_string();
    };
    if bytes % (1u64 << shift) == 0 {
        format_size(bytes)
    } else {
        format!("{:.1}{suffix}", bytes as f64 / (1u64 << shift) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_exact_or_rounded_for_reading() {
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(3 << 20), "3M");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(1536 << 10), "1536K");
        assert_eq!(readable_size(64 << 10), "64K");
        assert_eq!(readable_size((128u64 << 40) - 4096), "128.0T");
        assert_eq!(readable_size(1536 << 10), "1.5M");
    }
}
