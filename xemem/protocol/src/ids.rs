//! Identifiers. A segment id is `enclave << 32 | local`, an access id (apid) the same with bit 31
//! of the low half set; both enclave and local parts are in `1..2^31`, so every valid id is a
//! positive `i64` (never 0 or -1, which XPMEM reserves for "none" and "error"), the enclave that
//! owns a segment can be read from its id (routing needs no lookup), and a segment id passed
//! where an access id is expected, or the reverse, is recognised as invalid rather than found.
//! Counters start at a place drawn from the instance ([`IdCounter`]), so a name server that
//! restarts does not hand out the ids of its previous life again.

/// An enclave's id, handed out by the name server. 0 means "not assigned yet".
pub type EnclaveId = u32;

/// The name server's own enclave id, fixed as in XEMEM.
pub const NAME_SERVER_ENCLAVE: EnclaveId = 1;
/// Largest enclave id and largest local id (both fit 31 bits so ids stay positive).
pub const MAX_ENCLAVE_ID: EnclaveId = 0x7fff_ffff;
pub const MAX_LOCAL_ID: u32 = 0x7fff_ffff;
/// Largest local id a name server hands out. The ones above are its host's, for permits the
/// host grants in enclave 1 on another name server's behalf (clowderd's bridged permits, the
/// broker's surrogates), so the two can never collide.
pub const MAX_NAME_SERVER_LOCAL: u32 = 0x5fff_ffff;

const ACCESS_TAG: u64 = 0x8000_0000;

/// Hands out the ids `first..=last` in turn, wrapping after `last`, starting at a place drawn
/// from `instance`. Name servers and brokers give each instance of themselves its own value
/// (random on the host), so the ids of a daemon and of the same daemon restarted start far
/// apart: an id kept from before the restart names nothing now instead of someone else's
/// segment, unless the two instances' runs of ids meet (a chance of about 2n / span when each
/// hands out n).
#[derive(Clone, Debug)]
pub struct IdCounter {
    first: u32,
    last: u32,
    next: u32,
}

impl IdCounter {
    pub fn new(first: u32, last: u32, instance: u64) -> IdCounter {
        let last = last.max(first);
        let span = u64::from(last - first) + 1;
        IdCounter { first, last, next: first + (spread(instance) % span) as u32 }
    }

    pub fn next_id(&mut self) -> u32 {
        let id = self.next;
        self.next = if id >= self.last { self.first } else { id + 1 };
        id
    }
}

/// SplitMix64's finaliser: instance values close together (clock readings, test seeds) start
/// their counters far apart.
fn spread(instance: u64) -> u64 {
    let mut z = instance;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

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

/// The methods the two id types share; they differ only in the tag bit of their low half.
macro_rules! packed_id {
    ($(#[$doc:meta])* $id:ident, $tag:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $id(i64);

        impl $id {
            pub fn new(enclave: EnclaveId, local: u32) -> Option<$id> {
                pack(enclave, local, $tag).map($id)
            }
            /// Accepts exactly the values [`Self::new`] can produce.
            pub fn from_raw(raw: i64) -> Option<$id> {
                unpack(raw, $tag).map(|_| $id(raw))
            }
            pub fn raw(self) -> i64 {
                self.0
            }
            /// The enclave in the high half (see the type).
            pub fn enclave(self) -> EnclaveId {
                (self.0 as u64 >> 32) as u32
            }
            pub fn local(self) -> u32 {
                self.0 as u32 & MAX_LOCAL_ID
            }
        }
    };
}

packed_id!(
    /// A globally unique segment id (`xpmem_segid_t`); its enclave is the one that owns the
    /// segment.
    SegmentId,
    0
);
packed_id!(
    /// A globally unique access id (`xpmem_apid_t`): the permit one `xpmem_get` granted; its
    /// enclave is that of the name server that granted it.
    AccessId,
    ACCESS_TAG
);
