#![no_std]
//! XEMEM, the XPMEM API across enclaves (Kocoloski et al., HPDC'15, sections 3-4), as pure code
//! shared by the lightweight kernel and the host: no I/O, `alloc` only, no input makes it panic.
//!
//! * [`ids`]: globally unique segment and access ids (enclave id + local id, always > 0).
//! * [`perm`]: SysV-IPC-like permission checks (owner uid/gid, mode bits, root bypass).
//! * [`wire`]: the messages between enclaves and their strict encoding.
//! * [`names`]: segment names, one name space for name servers that share a table.
//! * [`nameserver`]: the name server's state machine (make/remove/get/release/attach/detach,
//!   named segments, signals, enclave-id allocation).
//! * [`node`]: one enclave's protocol engine: name-server discovery by broadcast, enclave-id
//!   requests, the per-hop routing table, request retries, and the owner's side of attach.
//! * [`pci`]: the Linux-VM device's ids and mailbox layout, shared with libxpmem's C backend.
//!
//! Frame lists travel as runs `(first frame, count)`, so message size and work grow with the
//! number of contiguous runs, not with the number of pages.

extern crate alloc;

pub mod answers;
pub mod ids;
pub mod names;
pub mod nameserver;
pub mod node;
pub mod pci;
pub mod perm;
mod vecmap;
pub mod wire;

#[cfg(test)]
extern crate std;
#[cfg(test)]
mod names_tests;
#[cfg(test)]
mod network_tests;
#[cfg(test)]
mod tests;

pub use ids::{AccessId, EnclaveId, SegmentId, NAME_SERVER_ENCLAVE};
pub use nameserver::{NameServer, Principal};
pub use perm::{Credentials, Owner};

/// The page size every offset and length is checked against.
pub const PAGE_SIZE: u64 = 4096;
/// `XPMEM_MAXADDR_SIZE`: as a make size, "the whole address space".
pub const MAXADDR_SIZE: u64 = u64::MAX;
/// The end of a user address space on x86-64 (47-bit, last page excluded as Linux does); a
/// whole-address-space segment is truncated to it as XPMEM truncates to TASK_SIZE.
pub const USER_ADDRESS_LIMIT: u64 = 0x7fff_ffff_f000;
/// `XPMEM_RDONLY` and `XPMEM_RDWR`: the access an `xpmem_get` asks for.
pub const ACCESS_READ_ONLY: u32 = 0x1;
pub const ACCESS_READ_WRITE: u32 = 0x2;

/// Why an operation failed. Each maps to the errno XPMEM gives for the same case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Bad alignment, range, flags, or an id that can never be valid (EINVAL).
    Invalid,
    /// No such segment, access id or name (ENOENT).
    NotFound,
    /// Permission denied, or the caller does not own the id (EACCES).
    Denied,
    /// Out of ids (EBUSY, as XPMEM when its segment counter is exhausted).
    Exhausted,
    /// A segment with this name exists (EEXIST).
    NameTaken,
    /// The name server or the owner could not be reached in time (ETIMEDOUT).
    Unreachable,
    /// A message could not be decoded (EPROTO).
    Malformed,
    /// EINVAL, for a reason the errno alone does not say: the owner's memory is on 2 MiB
    /// pages (a hugepage enclave's RAM), which another process can map only whole, and the
    /// range asked for is not whole, aligned 2 MiB pages of it.
    WholePagesOnly,
}

impl Error {
    /// The Linux errno for this error.
    pub fn errno(self) -> i32 {
        match self {
            Error::Invalid => 22,
            Error::NotFound => 2,
            Error::Denied => 13,
            Error::Exhausted => 16,
            Error::NameTaken => 17,
            Error::Unreachable => 110,
            Error::Malformed => 71,
            Error::WholePagesOnly => 22,
        }
    }
    /// The wire code of this error (a small number; never 0).
    pub fn code(self) -> u16 {
        match self {
            Error::Invalid => 1,
            Error::NotFound => 2,
            Error::Denied => 3,
            Error::Exhausted => 4,
            Error::NameTaken => 5,
            Error::Unreachable => 6,
            Error::Malformed => 7,
            Error::WholePagesOnly => 8,
        }
    }
    pub fn from_code(code: u16) -> Option<Error> {
        Some(match code {
            1 => Error::Invalid,
            2 => Error::NotFound,
            3 => Error::Denied,
            4 => Error::Exhausted,
            5 => Error::NameTaken,
            6 => Error::Unreachable,
            7 => Error::Malformed,
            8 => Error::WholePagesOnly,
            _ => return None,
        })
    }
}

/// Checks an `xpmem_get` flags word: exactly one of read-only and read-write.
pub fn validate_access_flags(flags: u32) -> Result<(), Error> {
    match flags {
        ACCESS_READ_ONLY | ACCESS_READ_WRITE => Ok(()),
        _ => Err(Error::Invalid),
    }
}
