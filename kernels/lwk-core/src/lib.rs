//! The lightweight kernel's pure logic (the command line, address ranges, cpio archives,
//! log budgets, paths, the persistent enclave's rules): code with no I/O, no hardware and no
//! global state, kept apart from `kernels/lwk` so that it is tested on the host with `cargo
//! test` (the kernel itself builds for x86_64-unknown-none and cannot run tests).

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod cmdline;
pub mod cpio;
pub mod enclave;
pub mod ids;
pub mod path;
pub mod ranges;
pub mod ratelimit;
