//! Messages between enclaves and their encoding.
//!
//! A message is a 24-byte header, `u8 version (1), u8 kind, u16 zero, u32 body length,
//! u64 request, u32 origin enclave, u32 destination enclave`, then the body: the kind's fields
//! in order, little-endian. A `name` is `u8 length` and that many printable ASCII bytes
//! (length 0 in an optional name: none); a `list<T>` is `u32 count` and the items. Decoding is
//! strict: the body length must match, every field is range-checked (alignment, modes, flags,
//! ids, frame runs), and trailing bytes are an error, so a decoded message is one the encoder
//! would produce from valid values.
//!
//! | kind | body | fields |
//! |------|------|--------|
//! | 1 | `PingNameServer` | (none): broadcast by an enclave looking for the name server |
//! | 2 | `PongNameServer` | (none): "I reach the name server through this link" |
//! | 3 | `EnclaveIdRequest` | u64 token |
//! | 4 | `EnclaveIdResponse` | u64 token, u32 enclave |
//! | 5 | `EnclaveGone` | u32 enclave |
//! | 16 | `Make` | u64 process, u64 vaddr, u64 size, u32 uid, u32 gid, u32 mode, name (optional) |
//! | 17 | `Remove` | u64 process, i64 segid |
//! | 18 | `Get` | u64 process, i64 segid, u32 access, u32 uid, list<u32> groups |
//! | 19 | `Release` | u64 process, i64 apid |
//! | 20 | `Attach` | u64 process, i64 apid, u64 offset, u64 size |
//! | 21 | `Detach` | u64 process, i64 apid |
//! | 22 | `Lookup` | name |
//! | 23 | `List` | i64 after |
//! | 24 | `Signal` | u64 process, i64 apid |
//! | 32 | `Serve` | u32 requester, u64 owner process, i64 segid, u64 vaddr, u64 size |
//! | 33 | `Notify` | u64 owner process, i64 segid |
//! | 34 | `Revoke` | u64 process, i64 apid: the segment behind the permit is gone; unmap its attachment |
//! | 48 | `Made` | i64 segid |
//! | 49 | `Done` | (none) |
//! | 50 | `Granted` | i64 apid, u64 size |
//! | 51 | `Attached` | i64 segid, u64 size, u32 first run, u32 total runs, list<run> runs, u8 has word, [u64 word address, u64 value] |
//! | 52 | `Found` | i64 segid |
//! | 53 | `Listed` | u8 more, list<i64 segid, u32 owner, u64 size, name (optional)> |
//! | 54 | `Revoked` | u64 process, i64 apid: the acknowledgement of a `Revoke`; nothing maps it now |
//! | 63 | `Failed` | u16 error code |
//!
//! A `run` is `u64 first frame, u64 frames`; first frame `u64::MAX` is a hole (no memory there:
//! touching it raises SIGBUS in the attacher, as XPMEM). An attach answer may take several
//! `Attached` messages, each carrying runs `first run .. first run + count` of `total runs`.
//! The first may name a [`MappingWord`]: the answer holds while that word holds its value.

use crate::ids::{AccessId, EnclaveId, SegmentId, MAX_ENCLAVE_ID};
use crate::perm::{MAX_GROUPS, MAX_MODE};
use crate::{Error, PAGE_SIZE};
use alloc::vec::Vec;

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 24;
/// The largest message, header included.
pub const MAX_MESSAGE_LEN: usize = 65536;
/// Runs per `Attached` message (16 bytes each; fits [`MAX_MESSAGE_LEN`]).
pub const MAX_RUNS_PER_MESSAGE: usize = 4000;
/// Runs in one whole attach answer: 2^20 runs covers 4 GiB of fully scattered 4 KiB pages.
pub const MAX_RUNS_PER_ATTACH: u32 = 1 << 20;
pub const MAX_LIST_ENTRIES: usize = 256;
pub const MAX_NAME_LEN: usize = 63;
/// Frames are 4 KiB page numbers of a 52-bit physical address space.
pub const MAX_FRAME: u64 = 1 << 40;
pub const HOLE: u64 = u64::MAX;

/// A segment name: 1..=63 printable ASCII bytes, no spaces.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Vec<u8>);

impl Name {
    pub fn new(bytes: &[u8]) -> Result<Name, Error> {
        if bytes.is_empty() || bytes.len() > MAX_NAME_LEN || !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(Error::Invalid);
        }
        Ok(Name(bytes.to_vec()))
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A word in the receiver's guest-physical memory (8-aligned, not 0) that holds `value` while
/// an attach answer still holds: the owner kernel's count of page-table changes, which the
/// daemon maps read-only into the attacher's machine. A receiver that compares it before using
/// the answer again needs no round trip to learn that the owner's mapping is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingWord {
    pub address: u64,
    pub value: u64,
}

/// A contiguous run of frames, or a hole of `frames` pages (`first == None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRun {
    pub first: Option<u64>,
    pub frames: u64,
}

impl FrameRun {
    pub fn valid(&self) -> bool {
        self.frames >= 1
            && self.frames <= MAX_FRAME
            && match self.first {
                None => true,
                Some(first) => first.checked_add(self.frames).is_some_and(|end| end <= MAX_FRAME),
            }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    pub segment: SegmentId,
    pub owner: EnclaveId,
    pub size: u64,
    pub name: Option<Name>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Chosen by the origin; the answer carries the same value.
    pub request: u64,
    pub origin: EnclaveId,
    pub destination: EnclaveId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    PingNameServer,
    PongNameServer,
    EnclaveIdRequest {
        token: u64,
    },
    EnclaveIdResponse {
        token: u64,
        enclave: EnclaveId,
    },
    EnclaveGone {
        enclave: EnclaveId,
    },
    Make {
        process: u64,
        vaddr: u64,
        size: u64,
        uid: u32,
        gid: u32,
        mode: u32,
        name: Option<Name>,
    },
    Remove {
        process: u64,
        segment: SegmentId,
    },
    Get {
        process: u64,
        segment: SegmentId,
        access: u32,
        uid: u32,
        groups: Vec<u32>,
    },
    Release {
        process: u64,
        access: AccessId,
    },
    Attach {
        process: u64,
        access: AccessId,
        offset: u64,
        size: u64,
    },
    Detach {
        process: u64,
        access: AccessId,
    },
    Lookup {
        name: Name,
    },
    List {
        after: i64,
    },
    Signal {
        process: u64,
        access: AccessId,
    },
    Serve {
        requester: EnclaveId,
        owner_process: u64,
        segment: SegmentId,
        vaddr: u64,
        size: u64,
    },
    Notify {
        owner_process: u64,
        segment: SegmentId,
    },
    /// From the name server (or the daemon serving host memory) to a permit holder's enclave:
    /// the memory behind `access` is going; the holder must unmap every attachment made
    /// through it (touching it afterwards is SIGBUS) and answer `Revoked`.
    Revoke {
        process: u64,
        access: AccessId,
    },
    Made {
        segment: SegmentId,
    },
    Done,
    Granted {
        access: AccessId,
        size: u64,
    },
    Attached(AttachedPart),
    Found {
        segment: SegmentId,
    },
    Listed {
        more: bool,
        entries: Vec<ListEntry>,
    },
    Revoked {
        process: u64,
        access: AccessId,
    },
    Failed {
        error: Error,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub body: Body,
}

/// Runs `first_run..` of an attach answer; the first part may carry its [`MappingWord`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedPart {
    pub segment: SegmentId,
    pub size: u64,
    pub first_run: u32,
    pub total_runs: u32,
    pub runs: Vec<FrameRun>,
    pub valid_while: Option<MappingWord>,
}

impl Body {
    fn kind(&self) -> u8 {
        match self {
            Body::PingNameServer => 1,
            Body::PongNameServer => 2,
            Body::EnclaveIdRequest { .. } => 3,
            Body::EnclaveIdResponse { .. } => 4,
            Body::EnclaveGone { .. } => 5,
            Body::Make { .. } => 16,
            Body::Remove { .. } => 17,
            Body::Get { .. } => 18,
            Body::Release { .. } => 19,
            Body::Attach { .. } => 20,
            Body::Detach { .. } => 21,
            Body::Lookup { .. } => 22,
            Body::List { .. } => 23,
            Body::Signal { .. } => 24,
            Body::Serve { .. } => 32,
            Body::Notify { .. } => 33,
            Body::Revoke { .. } => 34,
            Body::Made { .. } => 48,
            Body::Done => 49,
            Body::Granted { .. } => 50,
            Body::Attached(_) => 51,
            Body::Found { .. } => 52,
            Body::Listed { .. } => 53,
            Body::Revoked { .. } => 54,
            Body::Failed { .. } => 63,
        }
    }

    /// Is this an answer (routed back to a waiting requester) rather than a request?
    pub fn is_answer(&self) -> bool {
        self.kind() >= FIRST_ANSWER_KIND
    }
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn name(&mut self, name: Option<&Name>) {
        match name {
            None => self.u8(0),
            Some(name) => {
                self.u8(name.0.len() as u8);
                self.0.extend_from_slice(&name.0);
            }
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.bytes.len() < n {
            return Err(Error::Malformed);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Error> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, Error> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, Error> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn i64(&mut self) -> Result<i64, Error> {
        Ok(self.u64()? as i64)
    }
    fn segment(&mut self) -> Result<SegmentId, Error> {
        SegmentId::from_raw(self.i64()?).ok_or(Error::Malformed)
    }
    fn access(&mut self) -> Result<AccessId, Error> {
        AccessId::from_raw(self.i64()?).ok_or(Error::Malformed)
    }
    fn enclave(&mut self) -> Result<EnclaveId, Error> {
        match self.u32()? {
            0 => Err(Error::Malformed),
            e if e > MAX_ENCLAVE_ID => Err(Error::Malformed),
            e => Ok(e),
        }
    }
    fn optional_name(&mut self) -> Result<Option<Name>, Error> {
        let len = self.u8()? as usize;
        if len == 0 {
            return Ok(None);
        }
        Name::new(self.take(len)?).map(Some).map_err(|_| Error::Malformed)
    }
    fn name(&mut self) -> Result<Name, Error> {
        self.optional_name()?.ok_or(Error::Malformed)
    }
    /// A list count, checked against `max` and against the bytes left (each item at least
    /// `item_len`), before anything is allocated.
    fn count(&mut self, max: usize, item_len: usize) -> Result<usize, Error> {
        let count = self.u32()? as usize;
        if count > max || count.saturating_mul(item_len) > self.bytes.len() {
            return Err(Error::Malformed);
        }
        Ok(count)
    }
    fn page_aligned(&mut self) -> Result<u64, Error> {
        let v = self.u64()?;
        if v % PAGE_SIZE != 0 {
            return Err(Error::Malformed);
        }
        Ok(v)
    }
    /// A length in bytes: page-aligned and not empty.
    fn extent(&mut self) -> Result<u64, Error> {
        let size = self.page_aligned()?;
        if size == 0 {
            return Err(Error::Malformed);
        }
        Ok(size)
    }
}

/// Kinds from here up are answers (`Made` is the first).
pub const FIRST_ANSWER_KIND: u8 = 48;

/// The request id in an encoded message's header, read without decoding the rest (`None` if
/// the bytes are too short to hold it).
pub fn request_id(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?))
}

/// The request an encoded answer answers, from its header alone (`None` for a request): for a
/// receiver that keeps requests of its own apart from its node's and must know whose an
/// answer is before decoding it.
pub fn answered_request(bytes: &[u8]) -> Option<u64> {
    if *bytes.get(1)? < FIRST_ANSWER_KIND {
        return None;
    }
    request_id(bytes)
}

impl Message {
    pub fn new(request: u64, origin: EnclaveId, destination: EnclaveId, body: Body) -> Message {
        Message { header: Header { request, origin, destination }, body }
    }

    /// Appends the encoding to `out`. Values the decoder would refuse (a run list longer than
    /// [`MAX_RUNS_PER_MESSAGE`], more groups than [`MAX_GROUPS`]) are an error.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        let mut w = Writer(out);
        w.u8(VERSION);
        w.u8(self.body.kind());
        w.u16(0);
        w.u32(0); // body length, patched below
        w.u64(self.header.request);
        w.u32(self.header.origin);
        w.u32(self.header.destination);
        match &self.body {
            Body::PingNameServer | Body::PongNameServer | Body::Done => {}
            Body::EnclaveIdRequest { token } => w.u64(*token),
            Body::EnclaveIdResponse { token, enclave } => {
                w.u64(*token);
                w.u32(*enclave);
            }
            Body::EnclaveGone { enclave } => w.u32(*enclave),
            Body::Make { process, vaddr, size, uid, gid, mode, name } => {
                w.u64(*process);
                w.u64(*vaddr);
                w.u64(*size);
                w.u32(*uid);
                w.u32(*gid);
                w.u32(*mode);
                w.name(name.as_ref());
            }
            Body::Remove { process, segment } => {
                w.u64(*process);
                w.i64(segment.raw());
            }
            Body::Get { process, segment, access, uid, groups } => {
                if groups.len() > MAX_GROUPS {
                    return Err(Error::Invalid);
                }
                w.u64(*process);
                w.i64(segment.raw());
                w.u32(*access);
                w.u32(*uid);
                w.u32(groups.len() as u32);
                for g in groups {
                    w.u32(*g);
                }
            }
            Body::Release { process, access }
            | Body::Detach { process, access }
            | Body::Signal { process, access }
            | Body::Revoke { process, access }
            | Body::Revoked { process, access } => {
                w.u64(*process);
                w.i64(access.raw());
            }
            Body::Attach { process, access, offset, size } => {
                w.u64(*process);
                w.i64(access.raw());
                w.u64(*offset);
                w.u64(*size);
            }
            Body::Lookup { name } => w.name(Some(name)),
            Body::List { after } => w.i64(*after),
            Body::Serve { requester, owner_process, segment, vaddr, size } => {
                w.u32(*requester);
                w.u64(*owner_process);
                w.i64(segment.raw());
                w.u64(*vaddr);
                w.u64(*size);
            }
            Body::Notify { owner_process, segment } => {
                w.u64(*owner_process);
                w.i64(segment.raw());
            }
            Body::Made { segment } | Body::Found { segment } => w.i64(segment.raw()),
            Body::Granted { access, size } => {
                w.i64(access.raw());
                w.u64(*size);
            }
            Body::Attached(AttachedPart { segment, size, first_run, total_runs, runs, valid_while }) => {
                if runs.len() > MAX_RUNS_PER_MESSAGE || (valid_while.is_some() && *first_run != 0) {
                    return Err(Error::Invalid);
                }
                w.i64(segment.raw());
                w.u64(*size);
                w.u32(*first_run);
                w.u32(*total_runs);
                w.u32(runs.len() as u32);
                for run in runs {
                    w.u64(run.first.unwrap_or(HOLE));
                    w.u64(run.frames);
                }
                match valid_while {
                    None => w.u8(0),
                    Some(word) => {
                        w.u8(1);
                        w.u64(word.address);
                        w.u64(word.value);
                    }
                }
            }
            Body::Listed { more, entries } => {
                if entries.len() > MAX_LIST_ENTRIES {
                    return Err(Error::Invalid);
                }
                w.u8(*more as u8);
                w.u32(entries.len() as u32);
                for e in entries {
                    w.i64(e.segment.raw());
                    w.u32(e.owner);
                    w.u64(e.size);
                    w.name(e.name.as_ref());
                }
            }
            Body::Failed { error } => w.u16(error.code()),
        }
        let body_len = (out.len() - start - HEADER_LEN) as u32;
        out[start + 4..start + 8].copy_from_slice(&body_len.to_le_bytes());
        if out.len() - start > MAX_MESSAGE_LEN {
            out.truncate(start);
            return Err(Error::Invalid);
        }
        Ok(())
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes exactly one message from `bytes`; anything malformed is [`Error::Malformed`].
    pub fn decode(bytes: &[u8]) -> Result<Message, Error> {
        if bytes.len() < HEADER_LEN || bytes.len() > MAX_MESSAGE_LEN {
            return Err(Error::Malformed);
        }
        let mut r = Reader { bytes };
        if r.u8()? != VERSION {
            return Err(Error::Malformed);
        }
        let kind = r.u8()?;
        if r.u16()? != 0 {
            return Err(Error::Malformed);
        }
        let body_len = r.u32()? as usize;
        if body_len != bytes.len() - HEADER_LEN {
            return Err(Error::Malformed);
        }
        let request = r.u64()?;
        let origin = r.u32()?;
        let destination = r.u32()?;
        if origin > MAX_ENCLAVE_ID || destination > MAX_ENCLAVE_ID {
            return Err(Error::Malformed);
        }
        let body = match kind {
            1 => Body::PingNameServer,
            2 => Body::PongNameServer,
            3 => Body::EnclaveIdRequest { token: r.u64()? },
            4 => Body::EnclaveIdResponse { token: r.u64()?, enclave: r.enclave()? },
            5 => Body::EnclaveGone { enclave: r.enclave()? },
            16 => {
                let process = r.u64()?;
                let vaddr = r.page_aligned()?;
                let size = r.u64()?;
                if size == 0 || (size != crate::MAXADDR_SIZE && size % PAGE_SIZE != 0) {
                    return Err(Error::Malformed);
                }
                let uid = r.u32()?;
                let gid = r.u32()?;
                let mode = r.u32()?;
                if mode > MAX_MODE {
                    return Err(Error::Malformed);
                }
                Body::Make { process, vaddr, size, uid, gid, mode, name: r.optional_name()? }
            }
            17 => Body::Remove { process: r.u64()?, segment: r.segment()? },
            18 => {
                let process = r.u64()?;
                let segment = r.segment()?;
                let access = r.u32()?;
                crate::validate_access_flags(access).map_err(|_| Error::Malformed)?;
                let uid = r.u32()?;
                let count = r.count(MAX_GROUPS, 4)?;
                let mut groups = Vec::with_capacity(count);
                for _ in 0..count {
                    groups.push(r.u32()?);
                }
                Body::Get { process, segment, access, uid, groups }
            }
            19 => Body::Release { process: r.u64()?, access: r.access()? },
            20 => Body::Attach { process: r.u64()?, access: r.access()?, offset: r.page_aligned()?, size: r.extent()? },
            21 => Body::Detach { process: r.u64()?, access: r.access()? },
            22 => Body::Lookup { name: r.name()? },
            23 => Body::List { after: r.i64()? },
            24 => Body::Signal { process: r.u64()?, access: r.access()? },
            32 => {
                let requester = r.enclave()?;
                let owner_process = r.u64()?;
                let segment = r.segment()?;
                let vaddr = r.page_aligned()?;
                let size = r.extent()?;
                if vaddr.checked_add(size).is_none() {
                    return Err(Error::Malformed);
                }
                Body::Serve { requester, owner_process, segment, vaddr, size }
            }
            33 => Body::Notify { owner_process: r.u64()?, segment: r.segment()? },
            34 => Body::Revoke { process: r.u64()?, access: r.access()? },
            48 => Body::Made { segment: r.segment()? },
            49 => Body::Done,
            50 => Body::Granted { access: r.access()?, size: r.page_aligned()? },
            51 => {
                let segment = r.segment()?;
                let size = r.extent()?;
                let first_run = r.u32()?;
                let total_runs = r.u32()?;
                let count = r.count(MAX_RUNS_PER_MESSAGE, 16)?;
                if total_runs == 0
                    || total_runs > MAX_RUNS_PER_ATTACH
                    || count == 0
                    || (first_run as u64 + count as u64) > total_runs as u64
                {
                    return Err(Error::Malformed);
                }
                let mut runs = Vec::with_capacity(count);
                for _ in 0..count {
                    let first = r.u64()?;
                    let run = FrameRun { first: if first == HOLE { None } else { Some(first) }, frames: r.u64()? };
                    if !run.valid() {
                        return Err(Error::Malformed);
                    }
                    runs.push(run);
                }
                let valid_while = match r.u8()? {
                    0 => None,
                    1 if first_run == 0 => {
                        let word = MappingWord { address: r.u64()?, value: r.u64()? };
                        if word.address == 0 || word.address % 8 != 0 || word.address >= MAX_FRAME * PAGE_SIZE {
                            return Err(Error::Malformed);
                        }
                        Some(word)
                    }
                    _ => return Err(Error::Malformed),
                };
                Body::Attached(AttachedPart { segment, size, first_run, total_runs, runs, valid_while })
            }
            52 => Body::Found { segment: r.segment()? },
            53 => {
                let more = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::Malformed),
                };
                let count = r.count(MAX_LIST_ENTRIES, 21)?;
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    entries.push(ListEntry {
                        segment: r.segment()?,
                        owner: r.enclave()?,
                        size: r.page_aligned()?,
                        name: r.optional_name()?,
                    });
                }
                Body::Listed { more, entries }
            }
            54 => Body::Revoked { process: r.u64()?, access: r.access()? },
            63 => Body::Failed { error: Error::from_code(r.u16()?).ok_or(Error::Malformed)? },
            _ => return Err(Error::Malformed),
        };
        if !r.bytes.is_empty() {
            return Err(Error::Malformed);
        }
        Ok(Message { header: Header { request, origin, destination }, body })
    }
}

/// Splits an attach answer into `Attached` messages of at most [`MAX_RUNS_PER_MESSAGE`] runs;
/// the first carries `valid_while`.
pub fn attached_parts(segment: SegmentId, size: u64, runs: &[FrameRun], valid_while: Option<MappingWord>) -> Result<Vec<Body>, Error> {
    if runs.is_empty() || runs.len() > MAX_RUNS_PER_ATTACH as usize {
        return Err(Error::Invalid);
    }
    let total_runs = runs.len() as u32;
    Ok(runs
        .chunks(MAX_RUNS_PER_MESSAGE)
        .enumerate()
        .map(|(i, chunk)| {
            Body::Attached(AttachedPart {
                segment,
                size,
                first_run: (i * MAX_RUNS_PER_MESSAGE) as u32,
                total_runs,
                runs: chunk.to_vec(),
                valid_while: if i == 0 { valid_while } else { None },
            })
        })
        .collect())
}

/// A whole attach answer's runs, and the word its first part carried.
pub type AssembledRuns = (Vec<FrameRun>, Option<MappingWord>);

/// Collects the parts of one attach answer, in order; refuses gaps, repeats, disagreement
/// between parts, and run lists whose pages do not add up to the size asked for.
#[derive(Debug, Default)]
pub struct RunAssembler {
    expected: Option<(SegmentId, u64, u32)>,
    runs: Vec<FrameRun>,
    pages: u64,
    valid_while: Option<MappingWord>,
}

impl RunAssembler {
    /// Feeds one part; `Ok(Some((runs, the first part's word)))` once complete. The first
    /// part's runs are kept as they are (no copy: an answer in one part, the usual case, is
    /// handed on as decoded).
    pub fn push(&mut self, part: AttachedPart) -> Result<Option<AssembledRuns>, Error> {
        let AttachedPart { segment, size, first_run, total_runs, runs, valid_while } = part;
        match self.expected {
            None => self.expected = Some((segment, size, total_runs)),
            Some(expected) if expected != (segment, size, total_runs) => return Err(Error::Malformed),
            Some(_) => {}
        }
        if first_run as usize != self.runs.len() || (valid_while.is_some() && first_run != 0) {
            return Err(Error::Malformed);
        }
        if first_run == 0 {
            self.valid_while = valid_while;
        }
        for run in &runs {
            if !run.valid() {
                return Err(Error::Malformed);
            }
            self.pages = self.pages.checked_add(run.frames).ok_or(Error::Malformed)?;
        }
        if self.pages > size / PAGE_SIZE {
            return Err(Error::Malformed);
        }
        if self.runs.is_empty() {
            self.runs = runs;
        } else {
            self.runs.extend_from_slice(&runs);
        }
        if self.runs.len() == total_runs as usize {
            if self.pages != size / PAGE_SIZE {
                return Err(Error::Malformed);
            }
            return Ok(Some((core::mem::take(&mut self.runs), self.valid_while.take())));
        }
        if self.runs.len() > total_runs as usize {
            return Err(Error::Malformed);
        }
        Ok(None)
    }
}
