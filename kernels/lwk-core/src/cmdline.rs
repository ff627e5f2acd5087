//! The kernel command line.
//!
//! ```text
//! [lwk.heap=SIZE] [lwk.stack=SIZE] [lwk.env=NAME=VALUE]... [lwk.cpus=N] [lwk.fpu=xsave|ring3|fxsave] [lwk.fastcalls=off]
//!     [lwk.verbose] [lwk.crash=panic|fault] [lwk.id_block=N] [clowder.*=...] -- ARGV0 ARG1 ...
//! ```
//! `lwk.id_block` is the block of thread and process ids clowderd gives the enclave (`ids`).
//! Everything after the first `--` word is the job's argv, split at spaces; double quotes
//! group words with spaces (`"a b"`). Without `--` the job's argv is `[/job]`. clowder-vmm
//! appends its `clowder.*` keys after everything, so trailing `clowder.*` words are not argv.
//! SIZE is written as everywhere in clowder (the `hwspec` crate: `4096`, `512K`, `64M`,
//! `1GiB`). The `clowder.*` keys are the ones clowder-vmm appends (docs/guest-abi.md).

use alloc::string::String;
use alloc::vec::Vec;

pub const DEFAULT_EXIT_PORT: u16 = 0xf4;
pub const DEFAULT_STACK_SIZE: u64 = 8 << 20;
pub const DEFAULT_ARGV0: &str = "/job";

/// Splits the command line at the first `--` word: the kernel's part and the job's argv.
fn split_at_separator(command_line: &str) -> (&str, Option<&str>) {
    let is_separator_at = |start: usize| {
        let before_ok = start == 0 || command_line.as_bytes()[start - 1] == b' ';
        let rest = &command_line[start + 2..];
        before_ok && (rest.is_empty() || rest.starts_with(' '))
    };
    match command_line.match_indices("--").map(|(start, _)| start).find(|&start| is_separator_at(start)) {
        Some(start) => (&command_line[..start], Some(&command_line[start + 2..])),
        None => (command_line, None),
    }
}

/// The kernel's own words: those before `--`.
fn kernel_words(command_line: &str) -> impl Iterator<Item = &str> {
    split_at_separator(command_line).0.split_ascii_whitespace()
}

/// The value of the last `key=value` word for `key` (`clowder.*` keys may also follow the
/// job's words, where clowder-vmm appends them).
pub fn value_of<'a>(command_line: &'a str, key: &str) -> Option<&'a str> {
    let words: &mut dyn Iterator<Item = &'a str> =
        if key.starts_with("clowder.") { &mut command_line.split_ascii_whitespace() } else { &mut kernel_words(command_line) };
    words.filter_map(|word| word.strip_prefix(key).and_then(|rest| rest.strip_prefix('='))).last()
}

pub fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// True if the kernel's part of the command line has the word `flag`.
pub fn has_flag(command_line: &str, flag: &str) -> bool {
    kernel_words(command_line).any(|word| word == flag)
}

/// True when clowder-vmm started us: it appends `clowder.*` keys.
pub fn started_by_clowder_vmm(command_line: &str) -> bool {
    command_line.split_ascii_whitespace().any(|word| word.starts_with("clowder."))
}

/// The port whose write ends the VM (usable before the heap exists).
pub fn exit_port(command_line: &str) -> u16 {
    value_of(command_line, "clowder.exit_port").and_then(parse_number).map_or(DEFAULT_EXIT_PORT, |port| port as u16)
}

pub struct JobOptions {
    /// `lwk.verbose`: the kernel reports the job's layout and timing.
    pub verbose: bool,
    /// `None`: the loader picks (all memory it can spare).
    pub heap_size: Option<u64>,
    pub stack_size: u64,
    pub argv: Vec<String>,
    pub env: Vec<String>,
}

#[derive(Debug)]
pub struct BadOption(pub String);

impl JobOptions {
    pub fn parse(command_line: &str) -> Result<JobOptions, BadOption> {
        let size_option = |key: &str| -> Result<Option<u64>, BadOption> {
            match value_of(command_line, key) {
                None => Ok(None),
                Some(text) => hwspec::parse_size(text).map(Some).map_err(|error| BadOption(alloc::format!("{key}: {error}"))),
            }
        };
        let env = kernel_words(command_line).filter_map(|word| word.strip_prefix("lwk.env=")).map(String::from).collect();
        let mut words = split_at_separator(command_line).1.map(split_quoted).unwrap_or_default();
        // clowder-vmm appends its keys at the very end, after the job's words.
        while words.last().is_some_and(|word| word.starts_with("clowder.")) {
            words.pop();
        }
        let mut argv: Vec<String> =
            words.iter().map(|word| if word.contains('"') { word.replace('"', "") } else { String::from(*word) }).collect();
        if argv.is_empty() {
            argv.push(String::from(DEFAULT_ARGV0));
        }
        Ok(JobOptions {
            verbose: has_flag(command_line, "lwk.verbose"),
            heap_size: size_option("lwk.heap")?,
            stack_size: size_option("lwk.stack")?.unwrap_or(DEFAULT_STACK_SIZE),
            argv,
            env,
        })
    }
}

/// Splits at spaces and tabs; double quotes group words with spaces (the caller removes
/// them). Byte by byte and without allocating per character: every kernel instruction is
/// emulated on PVM.
fn split_quoted(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let is_space = |byte: u8| byte == b' ' || byte == b'\t';
    let mut words = Vec::new();
    let mut position = 0;
    while position < bytes.len() {
        if is_space(bytes[position]) {
            position += 1;
            continue;
        }
        let start = position;
        let mut quoted = false;
        while position < bytes.len() && (quoted || !is_space(bytes[position])) {
            quoted ^= bytes[position] == b'"';
            position += 1;
        }
        words.push(&text[start..position]);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_flags_are_the_kernels_words_before_the_separator() {
        let line = "lwk.heap=64M lwk.verbose lwk.heap=1G -- prog lwk.verbose x=1 clowder.exit_port=0x501";
        assert_eq!(value_of(line, "lwk.heap"), Some("1G"), "the last one counts");
        assert_eq!(value_of(line, "x"), None, "argv is not the kernel's");
        assert_eq!(value_of(line, "clowder.exit_port"), Some("0x501"), "clowder.* keys follow argv");
        assert!(has_flag(line, "lwk.verbose"));
        assert!(!has_flag("-- prog lwk.verbose", "lwk.verbose"));
        assert!(started_by_clowder_vmm(line) && !started_by_clowder_vmm("lwk.verbose"));
        assert_eq!(exit_port(line), 0x501);
        assert_eq!(exit_port(""), DEFAULT_EXIT_PORT);
    }

    #[test]
    fn numbers_decimal_or_hex() {
        for (text, expected) in [("42", Some(42)), ("0x2a", Some(42)), ("0x", None), ("x2a", None), ("", None), ("-1", None)] {
            assert_eq!(parse_number(text), expected, "{text:?}");
        }
    }

    #[test]
    fn job_options() {
        let options = JobOptions::parse("lwk.env=A=1 lwk.stack=1M lwk.env=B=two -- hello one \"two words\" clowder.cpus=2").unwrap();
        assert_eq!(options.argv, ["hello", "one", "two words"]);
        assert_eq!(options.env, ["A=1", "B=two"]);
        assert_eq!(options.stack_size, 1 << 20);
        assert_eq!(options.heap_size, None);
        assert!(!options.verbose);

        let defaults = JobOptions::parse("lwk.verbose lwk.heap=512K").unwrap();
        assert_eq!(defaults.argv, [DEFAULT_ARGV0], "no separator: the default argv");
        assert_eq!(defaults.stack_size, DEFAULT_STACK_SIZE);
        assert_eq!(defaults.heap_size, Some(512 << 10));
        assert!(defaults.verbose);

        // `--` is a separator only as a word of its own.
        assert_eq!(JobOptions::parse("a--b -- x --y").unwrap().argv, ["x", "--y"]);
        assert_eq!(JobOptions::parse("--").unwrap().argv, [DEFAULT_ARGV0]);
        assert_eq!(JobOptions::parse("-- a\tb  c").unwrap().argv, ["a", "b", "c"]);
    }

    #[test]
    fn bad_sizes_name_the_option() {
        let BadOption(message) = JobOptions::parse("lwk.stack=lots").err().unwrap();
        assert!(message.starts_with("lwk.stack: "), "{message}");
    }
}
