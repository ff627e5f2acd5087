//! CPU lists, as Linux writes them in sysfs and `taskset -c` reads them.
//!
//! The syntax: items separated by commas, each a CPU number (`5`) or an ascending inclusive
//! range (`0-3`, `4-4`). Numbers are decimal, at most `MAX_CPU`. Spaces around the whole list
//! are ignored (sysfs ends it with a newline), none inside it. The list keeps the order given
//! (for clowder-vmm's `--cores` the position is the vCPU index), so `3,1` is CPU 3 then CPU 1.
//! Refused: an empty list or item, a descending range, a CPU listed twice, a number above
//! `MAX_CPU`.

use crate::{Problem, Refused};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::{self, Write};

/// The largest CPU number: Linux's own limit (`NR_CPUS` is at most 8192). The bound also keeps
/// a range such as `0-99999999` from filling memory.
pub const MAX_CPU: usize = 8191;

/// Why a text is not a CPU list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuListProblem {
    Empty,
    /// Nothing between two commas, or before the first or after the last.
    EmptyItem,
    /// An item that is neither `N` nor `N-M` with decimal numbers.
    NotACpu(String),
    Descending {
        first: usize,
        last: usize,
    },
    Repeated(usize),
    /// A number above `MAX_CPU` (`usize::MAX` when it does not fit a `usize`).
    TooLarge(usize),
}

/// A refused CPU list: the text as given and why.
pub type CpuListError = Refused<CpuListProblem>;

impl Problem for CpuListProblem {
    const READS: &'static str = "a CPU list";
}

impl fmt::Display for CpuListProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuListProblem::Empty => f.write_str("it is empty"),
            CpuListProblem::EmptyItem => f.write_str("an item between commas is empty"),
            CpuListProblem::NotACpu(item) => {
                write!(f, "{item:?} is not a CPU number or range (examples: 5, 0-3, 0-3,5)")
            }
            CpuListProblem::Descending { first, last } => write!(f, "the range {first}-{last} goes down"),
            CpuListProblem::Repeated(cpu) => write!(f, "CPU {cpu} is listed twice"),
            CpuListProblem::TooLarge(usize::MAX) => write!(f, "a CPU number is above the largest, {MAX_CPU}"),
            CpuListProblem::TooLarge(cpu) => write!(f, "CPU {cpu} is above the largest, {MAX_CPU}"),
        }
    }
}

/// Parses a CPU list (see the module's documentation for the syntax), in the order given.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, CpuListError> {
    let refuse = |problem| Refused::new(text, problem);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(refuse(CpuListProblem::Empty));
    }
    let number = |digits: &str, item: &str| -> Result<usize, CpuListError> {
        if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(refuse(CpuListProblem::NotACpu(item.to_string())));
        }
        // Only digits: parsing fails on overflow alone.
        match digits.parse() {
            Ok(cpu) if cpu <= MAX_CPU => Ok(cpu),
            Ok(cpu) => Err(refuse(CpuListProblem::TooLarge(cpu))),
            Err(_) => Err(refuse(CpuListProblem::TooLarge(usize::MAX))),
        }
    };
    // One bit per possible CPU (1 KiB): repeats are found without sorting or allocating.
    let mut seen = [0u64; (MAX_CPU + 1) / 64];
    let mut cpus = Vec::new();
    for item in trimmed.split(',') {
        if item.is_empty() {
            return Err(refuse(CpuListProblem::EmptyItem));
        }
        let (first, last) = match item.split_once('-') {
            Some((first, last)) => (number(first, item)?, number(last, item)?),
            None => {
                let cpu = number(item, item)?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(refuse(CpuListProblem::Descending { first, last }));
        }
        for cpu in first..=last {
            let (word, bit) = (cpu / 64, 1u64 << (cpu % 64));
            if seen[word] & bit != 0 {
                return Err(refuse(CpuListProblem::Repeated(cpu)));
            }
            seen[word] |= bit;
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

/// CPUs written compactly, runs of consecutive numbers as ranges (`0-3,5`; `none` for no
/// CPUs), in the order given: `parse_cpu_list` reads it back.
pub fn format_cpu_list(cpus: impl IntoIterator<Item = usize>) -> String {
    let mut text = String::new();
    let mut write_run = |(first, last): (usize, usize)| {
        let comma = if text.is_empty() { "" } else { "," };
        // Writing to a String cannot fail.
        let _ = if first == last { write!(text, "{comma}{first}") } else { write!(text, "{comma}{first}-{last}") };
    };
    let mut run: Option<(usize, usize)> = None;
    for cpu in cpus {
        run = match run {
            Some((first, last)) if last.checked_add(1) == Some(cpu) => Some((first, cpu)),
            Some(previous) => {
                write_run(previous);
                Some((cpu, cpu))
            }
            None => Some((cpu, cpu)),
        };
    }
    if let Some(previous) = run {
        write_run(previous);
    }
    if text.is_empty() {
        text.push_str("none");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::{format, vec};

    /// Every form `parse_cpu_list` accepts and every way it refuses.
    #[test]
    fn the_cpu_list_table() {
        use CpuListProblem::*;
        let table: &[(&str, Result<Vec<usize>, CpuListProblem>)] = &[
            ("0", Ok(vec![0])),
            ("5", Ok(vec![5])),
            ("0,1", Ok(vec![0, 1])),
            ("0-3", Ok(vec![0, 1, 2, 3])),
            ("4-4", Ok(vec![4])),
            ("0-3,5", Ok(vec![0, 1, 2, 3, 5])),
            ("0-3,8,10-11", Ok(vec![0, 1, 2, 3, 8, 10, 11])),
            ("3,1", Ok(vec![3, 1])),
            ("8-9,0-1", Ok(vec![8, 9, 0, 1])),
            ("007", Ok(vec![7])),
            ("0-3\n", Ok(vec![0, 1, 2, 3])),
            (" 2 ", Ok(vec![2])),
            ("8191", Ok(vec![MAX_CPU])),
            ("", Err(Empty)),
            ("\n", Err(Empty)),
            ("0,", Err(EmptyItem)),
            (",0", Err(EmptyItem)),
            ("0,,1", Err(EmptyItem)),
            ("x", Err(NotACpu("x".into()))),
            ("-1", Err(NotACpu("-1".into()))),
            ("1-", Err(NotACpu("1-".into()))),
            ("1-2-3", Err(NotACpu("1-2-3".into()))),
            ("0, 1", Err(NotACpu(" 1".into()))),
            ("0 - 3", Err(NotACpu("0 - 3".into()))),
            ("+1", Err(NotACpu("+1".into()))),
            ("1.5", Err(NotACpu("1.5".into()))),
            ("3-1", Err(Descending { first: 3, last: 1 })),
            ("1,1", Err(Repeated(1))),
            ("0-3,2", Err(Repeated(2))),
            ("0-3,2-5", Err(Repeated(2))),
            ("8192", Err(TooLarge(8192))),
            ("0-99999999", Err(TooLarge(99999999))),
            ("99999999999999999999999", Err(TooLarge(usize::MAX))),
        ];
        crate::check_parse_table("parse_cpu_list", parse_cpu_list, table);
    }

    #[test]
    fn errors_name_the_text_and_the_reason_in_one_line() {
        let message = |text| format!("{}", parse_cpu_list(text).unwrap_err());
        assert_eq!(message(""), "\"\" is not a CPU list: it is empty");
        assert_eq!(message("0,,1"), "\"0,,1\" is not a CPU list: an item between commas is empty");
        assert_eq!(message("a"), "\"a\" is not a CPU list: \"a\" is not a CPU number or range (examples: 5, 0-3, 0-3,5)");
        assert_eq!(message("3-1"), "\"3-1\" is not a CPU list: the range 3-1 goes down");
        assert_eq!(message("0-3,2"), "\"0-3,2\" is not a CPU list: CPU 2 is listed twice");
        assert_eq!(message("9000"), "\"9000\" is not a CPU list: CPU 9000 is above the largest, 8191");
        assert_eq!(
            message("99999999999999999999999"),
            "\"99999999999999999999999\" is not a CPU list: a CPU number is above the largest, 8191"
        );
    }

    #[test]
    fn cpu_lists_format_as_ranges_and_read_back() {
        let table: &[(&[usize], &str)] = &[
            (&[], "none"),
            (&[5], "5"),
            (&[0, 1, 2, 3, 5], "0-3,5"),
            (&[0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
            (&[3, 1], "3,1"),
            (&[8, 9, 0, 1], "8-9,0-1"),
        ];
        for &(cpus, text) in table {
            assert_eq!(format_cpu_list(cpus.iter().copied()), text);
            if !cpus.is_empty() {
                assert_eq!(parse_cpu_list(text).as_deref(), Ok(cpus), "format_cpu_list's output reads back");
            }
        }
    }
}
