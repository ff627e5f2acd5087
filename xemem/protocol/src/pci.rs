//! The XEMEM PCI device's ids and mailbox layout (docs/xemem-pci.md, "The mailbox"): the one
//! definition of these wire values. The VMM's device (`vmm::pci::mailbox`) and the Linux guest
//! agent's keeper use these constants; C cannot, so libxpmem's guest backend and its fake
//! device test take them from `xemem/src/pci_mailbox.h`, which this module's test reads and
//! compares value by value. A header written by hand and checked here, rather than generated:
//! building libxpmem (`make -C xemem`) then needs no Rust step, and `cargo test -p xemem` (in
//! `make test`) fails on the first value that differs or is missing on either side.

/// Vendor id of clowder's virtual devices: not assigned by the PCI-SIG, only unique within
/// clowder's VMs, where no real device is passed through.
pub const VENDOR: u16 = 0xc10d;
/// The XEMEM device's id.
pub const DEVICE: u16 = 0x0001;
/// BAR0, the mailbox, in bytes.
pub const MAILBOX_SIZE: u64 = 64 << 10;
/// What the host writes at [`MAGIC_AT`] ("XEMP") and [`VERSION_AT`].
pub const MAGIC: u32 = 0x504d_4558;
pub const VERSION: u32 = 1;

/// Byte offsets in the mailbox: u32 magic and version (host), u32 doorbell (guest, last), u32
/// done (host, last), u32 op (guest), i32 error (host), u32 nruns (guest), u64 args[6] (guest),
/// u64 results[4] (host), a NUL-padded name (guest), then the runs (guest).
pub const MAGIC_AT: u64 = 0x00;
pub const VERSION_AT: u64 = 0x04;
pub const DOORBELL: u64 = 0x08;
pub const DONE: u64 = 0x0c;
pub const OP: u64 = 0x10;
pub const ERROR: u64 = 0x14;
pub const NRUNS: u64 = 0x18;
pub const ARGS: u64 = 0x20;
pub const RESULTS: u64 = 0x50;
pub const NAME: u64 = 0x80;
pub const NAME_LEN: u64 = 64;
pub const RUNS: u64 = 0x100;
/// One run: u64 guest-physical address, u64 length.
pub const RUN_SIZE: u64 = 16;

/// The ops (the value written at [`OP`]).
pub const OP_HELLO: u32 = 1;
pub const OP_RUNS: u32 = 2;
pub const OP_MAKE: u32 = 3;
pub const OP_REMOVE: u32 = 4;
pub const OP_GET: u32 = 5;
pub const OP_RELEASE: u32 = 6;
pub const OP_ATTACH: u32 = 7;
pub const OP_DETACH: u32 = 8;
pub const OP_LOOKUP: u32 = 9;
pub const OP_SIGNAL: u32 = 10;

/// libxpmem's messages to the guest agent's keeper (`CLOWDER_XEMEM_KEEPER`, an abstract
/// `SOCK_SEQPACKET` socket): 24 bytes each, u32 op, u32 zero, then two u64 words `a` and `b`.
/// KEEP: `a` an export's tag, pipes holding its pages as SCM_RIGHTS. MADE: `a` the tag, `b`
/// its segment id. DROP: `a` the tag (the process removed it). NOTIFY: `a` the tag, `b` the
/// segment id, one eventfd as SCM_RIGHTS, written once per signal to the segment. (Ops 4 and 5
/// registered attachments until they moved to the board below: a message per attach and
/// detach woke the agent, milliseconds of emulated guest kernel each on PVM.)
pub const KEEPER_KEEP: u32 = 1;
pub const KEEPER_MADE: u32 = 2;
pub const KEEPER_DROP: u32 = 3;
pub const KEEPER_NOTIFY: u32 = 6;
/// One keeper message's size.
pub const KEEPER_MESSAGE: u64 = 24;

/// The attachment board: a shared file in the guest (`/run/xemem-pci.attachments`, root's, made
/// by whichever of the agent and libxpmem opens it first) where libxpmem notes each attachment
/// with plain stores, and which the agent reads only when the daemon reports a touch of a
/// revoked placement, to find the processes to SIGBUS. [`BOARD_SLOTS`] slots of
/// [`BOARD_SLOT_SIZE`] bytes: u32 pid (0: free; taken by compare-and-swap), u32 generation (odd
/// while the slot's other fields are written: a reader retries), u64 the process's start time
/// (/proc/PID/stat field 22: a pid taken over by a later process never matches), u64 the
/// placement's window offset, u64 its length.
pub const BOARD_SLOTS: u64 = 4096;
pub const BOARD_SLOT_SIZE: u64 = 32;
pub const BOARD_PID_AT: u64 = 0;
pub const BOARD_GENERATION_AT: u64 = 4;
pub const BOARD_START_AT: u64 = 8;
pub const BOARD_OFFSET_AT: u64 = 16;
pub const BOARD_LEN_AT: u64 = 24;

/// What the node daemon tells a Linux guest's agent about XEMEM (carried in the enclave
/// channel's `HostMessage::Xemem`: a Linux guest runs no XEMEM node, the daemon plays it, so
/// that message's bytes for it are these events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEvent {
    /// A guest process touched (in user mode) the placement at this window offset after its
    /// segment was revoked: its attachers get SIGBUS.
    Revoked { window_offset: u64 },
    /// An attacher signalled this segment, owned by a guest process: its notify eventfd is
    /// written.
    Signal { segid: i64 },
}

const EVENT_REVOKED: u32 = 1;
const EVENT_SIGNAL: u32 = 2;

impl GuestEvent {
    /// 16 bytes: u32 kind, u32 zero, u64 value, little-endian.
    pub fn to_bytes(self) -> [u8; 16] {
        let (kind, value) = match self {
            GuestEvent::Revoked { window_offset } => (EVENT_REVOKED, window_offset),
            GuestEvent::Signal { segid } => (EVENT_SIGNAL, segid as u64),
        };
        let mut bytes = [0u8; 16];
        bytes[..4].copy_from_slice(&kind.to_le_bytes());
        bytes[8..].copy_from_slice(&value.to_le_bytes());
        bytes
    }

    /// `None` for anything but exactly what `to_bytes` makes.
    pub fn from_bytes(bytes: &[u8]) -> Option<GuestEvent> {
        let bytes: &[u8; 16] = bytes.try_into().ok()?;
        let kind = u32::from_le_bytes(bytes[..4].try_into().ok()?);
        let zero = u32::from_le_bytes(bytes[4..8].try_into().ok()?);
        let value = u64::from_le_bytes(bytes[8..].try_into().ok()?);
        match (kind, zero) {
            (EVENT_REVOKED, 0) => Some(GuestEvent::Revoked { window_offset: value }),
            (EVENT_SIGNAL, 0) if (value as i64) > 0 => Some(GuestEvent::Signal { segid: value as i64 }),
            _ => None,
        }
    }
}

// The fields follow each other without overlapping (checked when this crate is built).
const _: () = assert!(
    MAGIC_AT + 4 == VERSION_AT
        && VERSION_AT + 4 == DOORBELL
        && DOORBELL + 4 == DONE
        && DONE + 4 == OP
        && OP + 4 == ERROR
        && ERROR + 4 == NRUNS
        && ARGS + 6 * 8 == RESULTS
        && RESULTS + 4 * 8 <= NAME
        && NAME + NAME_LEN <= RUNS
        && RUNS % RUN_SIZE == 0
        && BOARD_PID_AT + 4 == BOARD_GENERATION_AT
        && BOARD_GENERATION_AT + 4 == BOARD_START_AT
        && BOARD_START_AT + 8 == BOARD_OFFSET_AT
        && BOARD_OFFSET_AT + 8 == BOARD_LEN_AT
        && BOARD_LEN_AT + 8 == BOARD_SLOT_SIZE
);

#[cfg(test)]
mod tests {
    use alloc::collections::BTreeMap;
    use alloc::format;
    use alloc::string::String;

    /// Every constant above under its C name (`PCI_` + the Rust name).
    fn values() -> BTreeMap<String, u64> {
        use super::*;
        let pairs: [(&str, u64); 40] = [
            ("VENDOR", VENDOR.into()),
            ("DEVICE", DEVICE.into()),
            ("MAILBOX_SIZE", MAILBOX_SIZE),
            ("MAGIC", MAGIC.into()),
            ("VERSION", VERSION.into()),
            ("MAGIC_AT", MAGIC_AT),
            ("VERSION_AT", VERSION_AT),
            ("DOORBELL", DOORBELL),
            ("DONE", DONE),
            ("OP", OP),
            ("ERROR", ERROR),
            ("NRUNS", NRUNS),
            ("ARGS", ARGS),
            ("RESULTS", RESULTS),
            ("NAME", NAME),
            ("NAME_LEN", NAME_LEN),
            ("RUNS", RUNS),
            ("RUN_SIZE", RUN_SIZE),
            ("OP_HELLO", OP_HELLO.into()),
            ("OP_RUNS", OP_RUNS.into()),
            ("OP_MAKE", OP_MAKE.into()),
            ("OP_REMOVE", OP_REMOVE.into()),
            ("OP_GET", OP_GET.into()),
            ("OP_RELEASE", OP_RELEASE.into()),
            ("OP_ATTACH", OP_ATTACH.into()),
            ("OP_DETACH", OP_DETACH.into()),
            ("OP_LOOKUP", OP_LOOKUP.into()),
            ("OP_SIGNAL", OP_SIGNAL.into()),
            ("KEEPER_KEEP", KEEPER_KEEP.into()),
            ("KEEPER_MADE", KEEPER_MADE.into()),
            ("KEEPER_DROP", KEEPER_DROP.into()),
            ("KEEPER_NOTIFY", KEEPER_NOTIFY.into()),
            ("KEEPER_MESSAGE", KEEPER_MESSAGE),
            ("BOARD_SLOTS", BOARD_SLOTS),
            ("BOARD_SLOT_SIZE", BOARD_SLOT_SIZE),
            ("BOARD_PID_AT", BOARD_PID_AT),
            ("BOARD_GENERATION_AT", BOARD_GENERATION_AT),
            ("BOARD_START_AT", BOARD_START_AT),
            ("BOARD_OFFSET_AT", BOARD_OFFSET_AT),
            ("BOARD_LEN_AT", BOARD_LEN_AT),
        ];
        pairs.iter().map(|(name, value)| (format!("PCI_{name}"), *value)).collect()
    }

    /// A C integer literal as the header writes one: decimal or 0x hex, maybe a u/U/l/L suffix.
    fn parse(literal: &str) -> Option<u64> {
        let digits = literal.trim_end_matches(['u', 'U', 'l', 'L']);
        match digits.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => digits.parse().ok(),
        }
    }

    #[test]
    fn guest_events_round_trip_and_garbage_is_refused() {
        use super::GuestEvent;
        for event in [GuestEvent::Revoked { window_offset: 0x20_0000 }, GuestEvent::Signal { segid: 0x1234_0000_0001 }] {
            assert_eq!(GuestEvent::from_bytes(&event.to_bytes()), Some(event));
        }
        let good = GuestEvent::Signal { segid: 5 }.to_bytes();
        assert_eq!(GuestEvent::from_bytes(&good[..15]), None, "short");
        let mut bad = good;
        bad[0] = 9;
        assert_eq!(GuestEvent::from_bytes(&bad), None, "unknown kind");
        let mut bad = good;
        bad[5] = 1;
        assert_eq!(GuestEvent::from_bytes(&bad), None, "padding not zero");
        assert_eq!(GuestEvent::from_bytes(&GuestEvent::Signal { segid: -3 }.to_bytes()), None, "not a segment id");
    }

    #[test]
    fn the_c_header_spells_the_same_values() {
        let header = include_str!("../../src/pci_mailbox.h");
        let mut in_header = BTreeMap::new();
        for line in header.lines() {
            let mut words = line.split_whitespace();
            if let (Some("#define"), Some(name), Some(literal)) = (words.next(), words.next(), words.next()) {
                // A parenthesised expression is derived from the others (PCI_MAX_RUNS).
                if name.starts_with("PCI_") && !literal.starts_with('(') {
                    let value = parse(literal).unwrap_or_else(|| panic!("pci_mailbox.h: {name} is not a plain literal: {line}"));
                    assert!(in_header.insert(String::from(name), value).is_none(), "pci_mailbox.h defines {name} twice");
                }
            }
        }
        assert_eq!(in_header, values(), "xemem/src/pci_mailbox.h and xemem/protocol/src/pci.rs disagree");
    }
}
