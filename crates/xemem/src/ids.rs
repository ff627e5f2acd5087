//! Identifiers. A segment id is `enclave << 32 | local`, an access id (apid) the same with bit 31
//! of the low half set; both enclave and local parts are in `1..2^31`, so every valid id is a
//! positive `i64` (never 0 or -1, which XPMEM reserves for "none" and "error"), the enclave that
//! owns a segment can be read from its id (routing needs no lookup), and a segment id passed
//! where an access id is expected, or the reverse, is recognised as invalid rather than found.

/// An enclave's id, handed out by the name server. 0 means "not assigned yet".
pub type EnclaveId = u32;

/// The name server's own enclave id, fixed as in XEMEM.
pub const NAME_SERVER_ENCLAVE: EnclaveId = 1;
/// Largest enclave id and largest local id (both fit 31 bits so ids stay positive).
pub const MAX_ENCLAVE_ID: EnclaveId = 0x7fff_ffff;
pub const MAX_LOCAL_ID: u32 = 0x7fff_ffff;

const ACCESS_TAG: u64 = 0x8000_0000;

fn pack(enclave: EnclaveId, local: u32, tag: u64) -> Option<i64> {
    if enclave == 0 || enclave > MAX_ENCLAVE_ID || local == 0 || local > MAX_LOCAL_ID {
        return None;
    }
    Some((((enclave as u64) << 32) | tag | local as u64) as i64)
}

fn unpack(raw: i64, tag: u64) -> Option<(EnclaveId, u32)> {
    if raw <= 0 {
        return None;
    }
    let raw = raw as u64;
    if raw & ACCESS_TAG != tag {
        return None;
    }
    let enclave = (raw >> 32) as u32;
    let local = (raw as u32) & MAX_LOCAL_ID;
    if enclave == 0 || local == 0 {
        return None;
    }
    Some((enclave, local))
}

/// A globally unique segment id (`xpmem_segid_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(i64);

impl SegmentId {
    pub fn new(enclave: EnclaveId, local: u32) -> Option<SegmentId> {
        pack(enclave, local, 0).map(SegmentId)
    }
    /// Accepts exactly the values [`SegmentId::new`] can produce.
    pub fn from_raw(raw: i64) -> Option<SegmentId> {
        unpack(raw, 0).map(|_| SegmentId(raw))
    }
    pub fn raw(self) -> i64 {
        self.0
    }
    /// The enclave that owns the segment.
    pub fn enclave(self) -> EnclaveId {
        (self.0 as u64 >> 32) as u32
    }
    pub fn local(self) -> u32 {
        self.0 as u32 & MAX_LOCAL_ID
    }
}

/// A globally unique access id (`xpmem_apid_t`): the permit one `xpmem_get` granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AccessId(i64);

impl AccessId {
    pub fn new(enclave: EnclaveId, local: u32) -> Option<AccessId> {
        pack(enclave, local, ACCESS_TAG).map(AccessId)
    }
    pub fn from_raw(raw: i64) -> Option<AccessId> {
        unpack(raw, ACCESS_TAG).map(|_| AccessId(raw))
    }
    pub fn raw(self) -> i64 {
        self.0
    }
    /// The enclave of the name server that granted it.
    pub fn enclave(self) -> EnclaveId {
        (self.0 as u64 >> 32) as u32
    }
    pub fn local(self) -> u32 {
        self.0 as u32 & MAX_LOCAL_ID
    }
}
