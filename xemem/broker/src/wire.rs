//! The broker protocol on the host's Unix socket (SOCK_SEQPACKET: one request or answer per
//! packet). libxpmem's C view of it (`xemem/src/xpmem_internal.h`) is checked against these
//! definitions by `tests/c_layout.rs`: constants, offsets, and packets each side makes.
//!
//! Request, 64 bytes (+ a name of 1..=63 bytes for `MAKE` and `LOOKUP`):
//! `u32 magic, u16 version, u16 op, u64 args[7]`.
//! Answer, 64 bytes: `u32 magic, u16 version, u16 op (echoed), i32 errno (0: success),
//! u32 runs, u64 results[6]`, then `runs` × 32-byte runs `u32 fd index (HOLE: none),
//! u32 flags, u64 file offset, u64 length, u64 zero`; descriptors travel as SCM_RIGHTS in the
//! same packet, in fd-index order.
//!
//! | op | from → to | args | results |
//! |----|-----------|------|---------|
//! | HELLO 1 | library → broker | | r0 protocol version |
//! | SERVE 2 | library → broker | (this connection now serves FETCH and NOTIFY) | |
//! | MAKE 3 | library → broker | vaddr, size, mode; name | r0 segid |
//! | REMOVE 4 | library → broker | segid | |
//! | GET 5 | library → broker | segid, flags | r0 apid, r1 size, r2 flags (`GET_REVOKED_BY_MESSAGE`) |
//! | RELEASE 6 | library → broker | apid | |
//! | ATTACH 7 | library → broker | apid, offset, size | r0 segid; runs + fds |
//! | DETACH 8 | library → broker | apid | |
//! | LOOKUP 9 | library → broker | name | r0 segid |
//! | SIGNAL 10 | library → broker | apid | |
//! | FETCH 16 | broker → owner | vaddr, size | runs + fds |
//! | NOTIFY 17 | broker → owner | segid | |
//! | REVOKE 18 | broker → holder | apid | |
//!
//! A GET of another enclave's segment answers with `GET_REVOKED_BY_MESSAGE` in r2: enclave
//! memory cannot be truncated under its attachers, so the library opens its serving
//! connection (SERVE) and answers REVOKE by replacing every attachment made through `apid`
//! with memory that raises SIGBUS.
//!
//! A failed request's answer has the errno and, in r0, the reason's code when the broker has
//! one (`xemem::Error::code`, 0 otherwise): reasons that share an errno are told apart, and
//! the library names them (`xemem_errmsg`), e.g. EINVAL for an attach of a hugepage enclave's
//! memory that is not whole 2 MiB pages (`WholePagesOnly`).
//!
//! Broker → owner requests carry a sequence number in `args[6]`; the owner echoes it in
//! `results[5]`, so an answer that comes after its request timed out is recognised as stale.

use xemem::Error;

pub const MAGIC: u32 = 0x4d4d_4558; // "XEMM" little-endian
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 64;
pub const RUN_LEN: usize = 32;
/// Runs in one answer: plenty for a range made of mappings (runs are per mapping, not per page).
pub const MAX_RUNS: usize = 4096;
pub const MAX_PACKET: usize = HEADER_LEN + MAX_RUNS * RUN_LEN;
pub const HOLE: u32 = u32::MAX;
/// The run's descriptor is a memfd the owner's library made from private memory, which the
/// broker may truncate when the owner is gone (its attachers then see SIGBUS).
pub const RUN_REVOCABLE: u32 = 1;

pub const SEQUENCE_ARG: usize = 6;
pub const SEQUENCE_RESULT: usize = 5;

pub const OP_HELLO: u16 = 1;
pub const OP_SERVE: u16 = 2;
pub const OP_MAKE: u16 = 3;
pub const OP_REMOVE: u16 = 4;
pub const OP_GET: u16 = 5;
pub const OP_RELEASE: u16 = 6;
pub const OP_ATTACH: u16 = 7;
pub const OP_DETACH: u16 = 8;
pub const OP_LOOKUP: u16 = 9;
pub const OP_SIGNAL: u16 = 10;
pub const OP_FETCH: u16 = 16;
pub const OP_NOTIFY: u16 = 17;
pub const OP_REVOKE: u16 = 18;

/// In a GET's answer (r2): the permit's attachments are revoked by a REVOKE message.
pub const GET_REVOKED_BY_MESSAGE: u64 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: u16,
    pub args: [u64; 7],
    pub name: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub fd_index: u32,
    pub flags: u32,
    pub offset: u64,
    pub length: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub op: u16,
    pub errno: i32,
    pub results: [u64; 6],
    pub runs: Vec<Run>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

impl Request {
    pub fn new(op: u16, args: &[u64]) -> Request {
        let mut all = [0u64; 7];
        all[..args.len().min(7)].copy_from_slice(&args[..args.len().min(7)]);
        Request { op, args: all, name: Vec::new() }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.name.len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.op.to_le_bytes());
        for arg in self.args {
            out.extend_from_slice(&arg.to_le_bytes());
        }
        out.extend_from_slice(&self.name);
        out
    }

    /// Strict: magic, version, a known op, and a name exactly where one belongs.
    pub fn decode(bytes: &[u8]) -> Result<Request, Error> {
        if bytes.len() < HEADER_LEN || u32_at(bytes, 0) != MAGIC || u16_at(bytes, 4) != VERSION {
            return Err(Error::Malformed);
        }
        let op = u16_at(bytes, 6);
        let takes_name = matches!(op, OP_MAKE | OP_LOOKUP);
        let known = matches!(op, OP_HELLO..=OP_SIGNAL | OP_FETCH | OP_NOTIFY);
        let name = &bytes[HEADER_LEN..];
        if !known || (!takes_name && !name.is_empty()) || name.len() > xemem::wire::MAX_NAME_LEN {
            return Err(Error::Malformed);
        }
        if op == OP_LOOKUP && name.is_empty() {
            return Err(Error::Malformed);
        }
        let mut args = [0u64; 7];
        for (i, arg) in args.iter_mut().enumerate() {
            *arg = u64_at(bytes, 8 + 8 * i);
        }
        Ok(Request { op, args, name: name.to_vec() })
    }
}

impl Answer {
    pub fn ok(op: u16, results: &[u64]) -> Answer {
        let mut all = [0u64; 6];
        all[..results.len().min(6)].copy_from_slice(&results[..results.len().min(6)]);
        Answer { op, errno: 0, results: all, runs: Vec::new() }
    }
    pub fn error(op: u16, errno: i32) -> Answer {
        Answer { op, errno, results: [0; 6], runs: Vec::new() }
    }
    /// A request failed with `error`: its errno, and its code in r0.
    pub fn failure(op: u16, error: Error) -> Answer {
        Answer { results: [error.code() as u64, 0, 0, 0, 0, 0], ..Answer::error(op, error.errno()) }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.runs.len() * RUN_LEN);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.op.to_le_bytes());
        out.extend_from_slice(&self.errno.to_le_bytes());
        out.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for r in self.results {
            out.extend_from_slice(&r.to_le_bytes());
        }
        for run in &self.runs {
            out.extend_from_slice(&run.fd_index.to_le_bytes());
            out.extend_from_slice(&run.flags.to_le_bytes());
            out.extend_from_slice(&run.offset.to_le_bytes());
            out.extend_from_slice(&run.length.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
        }
        out
    }

    /// Strict, as an owner's FETCH answer is untrusted: exact length, runs page-aligned and
    /// non-empty, descriptor indexes below `fds`, no unknown flags.
    pub fn decode(bytes: &[u8], fds: usize) -> Result<Answer, Error> {
        if bytes.len() < HEADER_LEN || u32_at(bytes, 0) != MAGIC || u16_at(bytes, 4) != VERSION {
            return Err(Error::Malformed);
        }
        let op = u16_at(bytes, 6);
        let errno = u32_at(bytes, 8) as i32;
        let count = u32_at(bytes, 12) as usize;
        if count > MAX_RUNS || bytes.len() != HEADER_LEN + count * RUN_LEN || !(0..=4095).contains(&errno) {
            return Err(Error::Malformed);
        }
        let mut results = [0u64; 6];
        for (i, r) in results.iter_mut().enumerate() {
            *r = u64_at(bytes, 16 + 8 * i);
        }
        let mut runs = Vec::with_capacity(count);
        for i in 0..count {
            let at = HEADER_LEN + i * RUN_LEN;
            let run = Run {
                fd_index: u32_at(bytes, at),
                flags: u32_at(bytes, at + 4),
                offset: u64_at(bytes, at + 8),
                length: u64_at(bytes, at + 16),
            };
            let page = xemem::PAGE_SIZE;
            if u64_at(bytes, at + 24) != 0
                || run.flags & !RUN_REVOCABLE != 0
                || run.length == 0
                || run.length % page != 0
                || run.offset % page != 0
                || (run.fd_index != HOLE && run.fd_index as usize >= fds)
                || run.offset.checked_add(run.length).is_none()
            {
                return Err(Error::Malformed);
            }
            runs.push(run);
        }
        Ok(Answer { op, errno, results, runs })
    }
}
