//! `clowderd`, the clowder node daemon: it partitions the host into enclaves (cores, memory, one
//! `clowder-vmm` process each), owns the host end of every enclave channel, launches jobs and
//! streams their output, serves their forwarded file calls, and removes enclaves that fail
//! without disturbing the others. The API is JSON lines on a Unix socket, typed in the
//! `clowder-api` crate (`docs/api-schema.md`), whose `client::Client` is its client side.

// `u64::is_multiple_of` is newer than the workspace's minimum Rust version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod admission;
pub mod api;
/// The daemon's client lives in the API crate; tests and tools reach it here too.
pub use clowder_api::client;
pub mod config_file;
pub mod console;
pub mod cores;
pub mod cpuset;
pub mod daemon;
pub mod enclave;
pub mod executable;
pub mod file_slots;
pub mod guest_ram;
pub mod hio;
pub mod link;
pub mod linux_enclave;
pub mod machine;
pub mod memory;
pub mod oneshot;
pub mod owner;
pub mod peer;
pub mod ring3_files;
pub mod server;
pub mod sockets;
pub mod sockets_helper;
/// The system-call layer (rustix), shared with the XEMEM broker.
pub use clowder_sys as sys;
pub mod xemem;
