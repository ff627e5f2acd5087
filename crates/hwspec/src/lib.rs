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

pub use cpus::{format_cpu_list, parse_cpu_list, CpuListError, CpuListProblem, MAX_CPU};
pub use size::{describe_size, format_size, parse_size, readable_size, SizeError, SizeProblem, GIB, KIB, MIB, TIB};
