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

/// Checks a parser against a table of texts and what each must give: the value, or the
/// problem its error names (the error keeping the text as given). `name` names the parser in
/// failures; `parts` splits an error into its text and its problem.
#[cfg(test)]
fn check_parse_table<T, E, P>(
    name: &str,
    parse: impl Fn(&str) -> Result<T, E>,
    parts: impl Fn(E) -> (alloc::string::String, P),
    table: &[(&str, Result<T, P>)],
) where
    T: PartialEq + core::fmt::Debug,
    P: PartialEq + core::fmt::Debug,
{
    for (text, expected) in table {
        let parsed = parse(text).map_err(|error| {
            let (kept, problem) = parts(error);
            assert_eq!(kept, *text, "the error keeps the text as given");
            problem
        });
        assert_eq!(parsed, *expected, "{name}({text:?})");
    }
}

pub use cpus::{format_cpu_list, parse_cpu_list, CpuListError, CpuListProblem, MAX_CPU};
pub use size::{describe_size, format_size, parse_size, readable_size, SizeError, SizeProblem, GIB, KIB, MIB, TIB};
