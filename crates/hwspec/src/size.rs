//! Byte sizes.
//!
//! The syntax: a whole decimal number, then an optional suffix. Every multiple is binary: `K`
//! and `KiB` are 2^10, `M`/`MiB` 2^20, `G`/`GiB` 2^30, `T`/`TiB` 2^40; `B` (or nothing) is bytes.
//! Suffixes are case-insensitive (`64m`, `1gib`). `KB`, `MB`, `GB` and `TB` are refused, since
//! they are as often read as powers of ten. Spaces around the text are ignored, none inside it;
//! no sign, fraction or hexadecimal.

use crate::{Problem, Refused};
use alloc::string::{String, ToString};
use core::fmt;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// Largest first: the formatters pick the largest unit that divides a size exactly.
const UNITS: [(u64, &str); 4] = [(TIB, "T"), (GIB, "G"), (MIB, "M"), (KIB, "K")];

/// Why a text is not a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeProblem {
    Empty,
    /// Not digits followed by a known suffix (`1.5G`, `-1`, `G`, `6x`).
    NotANumber,
    /// `KB`, `MB`, `GB` or `TB`.
    DecimalSuffix,
    /// More than `u64::MAX` bytes.
    TooLarge,
}

/// A refused size: the text as given and why.
pub type SizeError = Refused<SizeProblem>;

impl Problem for SizeProblem {
    const READS: &'static str = "a size";
}

impl fmt::Display for SizeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeProblem::Empty => f.write_str("it is empty"),
            SizeProblem::NotANumber => f.write_str(
                "expected a whole number of bytes, optionally followed by K, M, G or T (binary; \
                 KiB, MiB, GiB, TiB too), e.g. 4096, 512M or 1GiB",
            ),
            SizeProblem::DecimalSuffix => {
                f.write_str("KB, MB, GB and TB are ambiguous (powers of 10 or of 2?): write K, M, G, T or KiB, MiB, GiB, TiB")
            }
            SizeProblem::TooLarge => f.write_str("too large (more than 2^64 - 1 bytes)"),
        }
    }
}

/// Parses a size in bytes (see the module's documentation for the syntax).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let refuse = |problem| Refused::new(text, problem);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(refuse(SizeProblem::Empty));
    }
    let (digits, suffix) = trimmed.split_at(trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len()));
    let multiplier = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        "kb" | "mb" | "gb" | "tb" => return Err(refuse(SizeProblem::DecimalSuffix)),
        _ => return Err(refuse(SizeProblem::NotANumber)),
    };
    if digits.is_empty() {
        return Err(refuse(SizeProblem::NotANumber));
    }
    // Only digits are left, so the one way parsing fails is overflow.
    let number: u64 = digits.parse().map_err(|_| refuse(SizeProblem::TooLarge))?;
    number.checked_mul(multiplier).ok_or_else(|| refuse(SizeProblem::TooLarge))
}

/// A size the way `parse_size` reads it back, in the largest unit that divides it exactly
/// (`64M`, `1G`, `4097`): for command lines, flags and the API's replies.
pub fn format_size(bytes: u64) -> String {
    match UNITS.iter().find(|(unit, _)| bytes >= *unit && bytes % unit == 0) {
        Some((unit, suffix)) => alloc::format!("{}{suffix}", bytes / unit),
        None => bytes.to_string(),
    }
}

/// A size for a table, short, in the largest unit not above it: exact where that unit divides
/// it (`64K`, `1G`, as `format_size`), else rounded to one decimal (`1.5M`; 128 TiB minus a
/// page is `128.0T`). For reading only: a rounded figure does not read back.
pub fn readable_size(bytes: u64) -> String {
    match UNITS.iter().find(|(unit, _)| bytes >= *unit) {
        // An estimate for people: f64's 53 bits are plenty for one decimal.
        Some((unit, suffix)) if bytes % unit != 0 => alloc::format!("{:.1}{suffix}", bytes as f64 / *unit as f64),
        _ => format_size(bytes),
    }
}

/// A size for a sentence (`64 MiB`, `4097 bytes`): for messages.
pub fn describe_size(bytes: u64) -> String {
    match UNITS.iter().find(|(unit, _)| bytes >= *unit && bytes % unit == 0) {
        Some((unit, suffix)) => alloc::format!("{} {suffix}iB", bytes / unit),
        None => alloc::format!("{bytes} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    /// Every spelling `parse_size` accepts and every way it refuses, with the message.
    #[test]
    fn the_size_table() {
        use SizeProblem::*;
        let table: &[(&str, Result<u64, SizeProblem>)] = &[
            ("4096", Ok(4096)),
            ("0", Ok(0)),
            ("007", Ok(7)),
            ("512B", Ok(512)),
            ("512b", Ok(512)),
            ("64K", Ok(64 * KIB)),
            ("64k", Ok(64 * KIB)),
            ("64KiB", Ok(64 * KIB)),
            ("512M", Ok(512 * MIB)),
            ("512m", Ok(512 * MIB)),
            ("256MiB", Ok(256 * MIB)),
            ("256mib", Ok(256 * MIB)),
            ("256MIB", Ok(256 * MIB)),
            ("1G", Ok(GIB)),
            ("1GiB", Ok(GIB)),
            ("2T", Ok(2 * TIB)),
            ("2TiB", Ok(2 * TIB)),
            (" 1G\n", Ok(GIB)),
            ("16777215T", Ok(16777215 * TIB)),
            ("18446744073709551615", Ok(u64::MAX)),
            ("", Err(Empty)),
            ("  ", Err(Empty)),
            ("G", Err(NotANumber)),
            ("GiB", Err(NotANumber)),
            ("1.5G", Err(NotANumber)),
            ("-1", Err(NotANumber)),
            ("+1", Err(NotANumber)),
            ("6x", Err(NotANumber)),
            ("1 G", Err(NotANumber)),
            ("0x1000", Err(NotANumber)),
            ("1Gi", Err(NotANumber)),
            ("1P", Err(NotANumber)),
            ("64MB", Err(DecimalSuffix)),
            ("64kb", Err(DecimalSuffix)),
            ("1GB", Err(DecimalSuffix)),
            ("1TB", Err(DecimalSuffix)),
            ("16777216T", Err(TooLarge)),
            ("18446744073709551616", Err(TooLarge)),
            ("99999999999999999999999", Err(TooLarge)),
        ];
        crate::check_parse_table("parse_size", parse_size, table);
    }

    #[test]
    fn errors_name_the_text_and_the_reason_in_one_line() {
        let message = |text| format!("{}", parse_size(text).unwrap_err());
        assert_eq!(message(""), "\"\" is not a size: it is empty");
        assert!(message("1.5G").starts_with("\"1.5G\" is not a size: expected a whole number of bytes"));
        assert!(message("64MB").starts_with("\"64MB\" is not a size: KB, MB, GB and TB are ambiguous"));
        assert_eq!(message("99999999999T"), "\"99999999999T\" is not a size: too large (more than 2^64 - 1 bytes)");
        assert!(!message("1.5G").contains('\n'));
    }

    #[test]
    fn sizes_format_in_the_largest_exact_unit_and_read_back() {
        let table: &[(u64, &str, &str)] = &[
            (0, "0", "0 bytes"),
            (1000, "1000", "1000 bytes"),
            (4097, "4097", "4097 bytes"),
            (12 * KIB, "12K", "12 KiB"),
            (1536 * KIB, "1536K", "1536 KiB"),
            (64 * MIB, "64M", "64 MiB"),
            (3 * GIB + 512 * MIB, "3584M", "3584 MiB"),
            (GIB, "1G", "1 GiB"),
            (2 * TIB, "2T", "2 TiB"),
            (u64::MAX, "18446744073709551615", "18446744073709551615 bytes"),
        ];
        for &(bytes, literal, words) in table {
            assert_eq!(format_size(bytes), literal);
            assert_eq!(describe_size(bytes), words);
            assert_eq!(parse_size(literal), Ok(bytes), "format_size's output reads back");
        }
    }

    #[test]
    fn table_sizes_are_exact_in_their_largest_unit_or_rounded() {
        let table: &[(u64, &str)] = &[
            (1000, "1000"),
            (64 * KIB, "64K"),
            (GIB, "1G"),
            (4097, "4.0K"),
            (1536 * KIB, "1.5M"),
            (3 * GIB + 512 * MIB, "3.5G"),
            (128 * TIB - 4096, "128.0T"),
        ];
        for &(bytes, text) in table {
            assert_eq!(readable_size(bytes), text);
        }
    }
}
