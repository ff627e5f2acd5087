//! How people write hardware amounts, read and written one way everywhere: byte sizes (`4096`,
//! `512M`, `1GiB`) and CPU lists (`0-3,5`). The daemon (API and flags), the VMM's configuration
//! (TOML and flags) and the LWK's command line all parse with this crate, so a size or a core
//! list accepted by one is accepted by all, and refused with the same words.
//!
//! `no_std` with `alloc` (the LWK has a heap): errors keep the text they refuse, and CPU lists
//! are vectors.
#![no_std]

extern crate alloc;

mod cpus;
mod size;

use alloc::string::{String, ToString};
use core::fmt;

/// A text a parser refuses, kept as given, and the problem with it; shown as
/// `"<text>" is not <what the parser reads>: <the problem>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused<P> {
    pub text: String,
    pub problem: P,
}

/// A parser's problems: what it reads (`a size`), and (as `Display`) what is wrong.
pub trait Problem: fmt::Display + fmt::Debug {
    const READS: &'static str;
}

impl<P> Refused<P> {
    fn new(text: &str, problem: P) -> Refused<P> {
        Refused { text: text.to_string(), problem }
    }
}

impl<P: Problem> fmt::Display for Refused<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not {}: {}", self.text, P::READS, self.problem)
    }
}

impl<P: Problem> core::error::Error for Refused<P> {}

/// Checks a parser against a table of texts and what each must give: the value, or the
/// problem its error names (the error keeping the text as given). `name` names the parser in
/// failures.
#[cfg(test)]
fn check_parse_table<T, P>(name: &str, parse: impl Fn(&str) -> Result<T, Refused<P>>, table: &[(&str, Result<T, P>)])
where
    T: PartialEq + core::fmt::Debug,
    P: PartialEq + core::fmt::Debug,
{
    for (text, expected) in table {
        let parsed = parse(text).map_err(|error| {
            assert_eq!(error.text, *text, "the error keeps the text as given");
            error.problem
        });
        assert_eq!(parsed, *expected, "{name}({text:?})");
    }
}

pub use cpus::{format_cpu_list, parse_cpu_list, CpuListError, CpuListProblem, MAX_CPU};
pub use size::{describe_size, format_size, parse_size, readable_size, SizeError, SizeProblem, GIB, KIB, MIB, TIB};
