#![no_std]
//! The clowder enclave channel: a pair of single-producer, single-consumer message rings in a
//! region of memory shared by a guest kernel and a host process.
//!
//! Both sides link this crate: the host formats the region with [`Channel::init`] and uses
//! [`Channel::host_end`]; the guest finds the region on its command line
//! (`clowder.channel=<gpa>,<size>`, see `docs/guest-abi.md`), validates it with
//! [`Channel::attach`] and uses [`Channel::guest_end`].
//!
//! # Layout
//!
//! All integers are little-endian (both sides are x86-64). The region is at least three pages,
//! a multiple of 4096 bytes, and page aligned.
//!
//! Header page, offset 0:
//!
//! | offset  | type | field |
//! |---------|------|-------|
//! | `0x000` | u64  | magic, [`MAGIC`] (`"CLWDCHAN"`); written last by `init` |
//! | `0x008` | u32  | version, [`VERSION`] |
//! | `0x00c` | u32  | slot size in bytes (a power of two, 64..=4096) |
//! | `0x010` | u64  | region size in bytes |
//! | `0x018` | u32  | slots per ring |
//! | `0x040` | u64  | guest→host ring: producer counter (written by the guest) |
//! | `0x080` | u64  | guest→host ring: consumer counter (written by the host) |
//! | `0x0c0` | u32  | guest→host ring: `waiting`, set by the host before it sleeps |
//! | `0x100` | u64  | host→guest ring: producer counter (written by the host) |
//! | `0x140` | u64  | host→guest ring: consumer counter (written by the guest) |
//! | `0x180` | u32  | host→guest ring: `waiting`, set by the guest before it sleeps |
//!
//! Each counter has a 64-byte cache line of its own so the two sides never write the same line.
//! Counters count messages since `init` and never wrap in practice (2^64 messages); message `n`
//! lives in slot `n % slots`. A ring holds `slots` messages: it is full when
//! `producer - consumer == slots` and empty when they are equal.
//!
//! The guest→host ring starts at offset `0x1000`, the host→guest ring right after it
//! (`0x1000 + slots * slot_size`); `slots = (size - 0x1000) / 2 / slot_size`. A slot is a u32
//! message length, a u32 that is zero, then the payload (at most `slot_size - 8` bytes).
//!
//! # Sleeping and waking (poll, then sleep)
//!
//! A consumer that finds its ring empty may sleep: it calls [`Endpoint::set_waiting`]`(true)`,
//! checks the ring once more (a message may have arrived in between), and only then sleeps; when
//! it wakes it clears the flag. A producer calls [`Endpoint::send`] and then, only if
//! [`Endpoint::peer_waiting`] is true, rings the doorbell (guest: a port write; host: an irqfd).
//! Both sides order "publish, then look at the other side's word" with a full fence, so a message
//! is never left in the ring with its consumer asleep and no doorbell rung.
//!
//! # Trust
//!
//! Nothing the peer writes is trusted. Each endpoint keeps its own counters privately and only
//! publishes them; it reads the peer's counter and checks that it moved forwards by no more than
//! the ring allows, and it checks every message length against the slot. Anything else is
//! reported as an error ([`Corruption`]); no value in the region can make this crate panic or
//! access memory outside the region.

// `usize::is_multiple_of` is newer than the workspace's minimum Rust version (1.85).
#![allow(clippy::manual_is_multiple_of)]

#[cfg(test)]
extern crate std;

mod shared;

use core::fmt;
use core::sync::atomic::{fence, Ordering};

use shared::SharedRegion;

/// `"CLWDCHAN"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"CLWDCHAN");
/// Layout version; bumped on any incompatible change.
pub const VERSION: u32 = 1;
pub const PAGE_SIZE: usize = 4096;
/// The header page.
pub const HEADER_SIZE: usize = PAGE_SIZE;
/// Size of the channel region the VMM reserves by default.
pub const DEFAULT_SIZE: usize = 64 * 1024;
pub const DEFAULT_SLOT_SIZE: usize = 256;
pub const MIN_SLOT_SIZE: usize = 64;
pub const MAX_SLOT_SIZE: usize = 4096;
/// Bytes in front of each slot's payload: u32 length, u32 zero.
pub const SLOT_HEADER_SIZE: usize = 8;
/// The smallest region: header page plus one page per ring.
pub const MIN_SIZE: usize = 3 * PAGE_SIZE;

mod offsets {
    pub const MAGIC: usize = 0x000;
    pub const VERSION: usize = 0x008;
    pub const SLOT_SIZE: usize = 0x00c;
    pub const REGION_SIZE: usize = 0x010;
    pub const SLOTS: usize = 0x018;
    pub const GUEST_TO_HOST: super::RingControl = super::RingControl { producer: 0x040, consumer: 0x080, waiting: 0x0c0 };
    pub const HOST_TO_GUEST: super::RingControl = super::RingControl { producer: 0x100, consumer: 0x140, waiting: 0x180 };
}

/// Where one ring's control words live in the header page.
#[derive(Clone, Copy, Debug)]
struct RingControl {
    producer: usize,
    consumer: usize,
    waiting: usize,
}

/// The geometry of a channel region, derived from its size and slot size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub size: usize,
    pub slot_size: usize,
    pub slots_per_ring: usize,
}

impl Layout {
    pub fn new(size: usize, slot_size: usize) -> Result<Layout, LayoutError> {
        if size < MIN_SIZE {
            return Err(LayoutError::TooSmall);
        }
        if size % PAGE_SIZE != 0 {
            return Err(LayoutError::NotPageMultiple);
        }
        if !slot_size.is_power_of_two() || !(MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&slot_size) {
            return Err(LayoutError::BadSlotSize);
        }
        // Sizes must fit the header's u32/u64 fields on every target.
        if u32::try_from(slot_size).is_err() || u64::try_from(size).is_err() {
            return Err(LayoutError::TooLarge);
        }
        let slots_per_ring = (size - HEADER_SIZE) / 2 / slot_size;
        if u32::try_from(slots_per_ring).is_err() {
            return Err(LayoutError::TooLarge);
        }
        Ok(Layout { size, slot_size, slots_per_ring })
    }

    /// The largest message a slot holds.
    pub fn max_message_len(&self) -> usize {
        self.slot_size - SLOT_HEADER_SIZE
    }

    pub fn guest_to_host_ring_offset(&self) -> usize {
        HEADER_SIZE
    }

    pub fn host_to_guest_ring_offset(&self) -> usize {
        HEADER_SIZE + self.slots_per_ring * self.slot_size
    }
}

/// Why a size/slot-size pair cannot form a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    TooSmall,
    NotPageMultiple,
    BadSlotSize,
    TooLarge,
    /// The base address is not page aligned.
    Misaligned,
}

/// Why [`Channel::attach`] refused a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachError {
    Layout(LayoutError),
    BadMagic(u64),
    BadVersion(u32),
    /// The header's region size differs from the size the caller was told.
    SizeMismatch {
        header: u64,
        expected: u64,
    },
    /// The header's slot count is not the one its sizes imply.
    SlotCountMismatch {
        header: u32,
        expected: u32,
    },
}

/// What the peer got wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// The peer's counter moved backwards, or further ahead than the ring allows.
    CounterOutOfRange { seen: u64, expected_from: u64, expected_to: u64 },
    /// A message length larger than the slot's payload.
    LengthTooLarge { length: u32, max: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The ring holds `slots_per_ring` unconsumed messages; try again later.
    Full,
    /// The message is longer than [`Endpoint::max_message_len`].
    TooLarge {
        length: usize,
        max: usize,
    },
    Corrupt(Corruption),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// The next message does not fit the buffer; it stays in the ring.
    BufferTooSmall {
        needed: usize,
    },
    Corrupt(Corruption),
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::TooSmall => write!(f, "channel region smaller than {MIN_SIZE} bytes"),
            LayoutError::NotPageMultiple => write!(f, "channel size not a multiple of 4096"),
            LayoutError::BadSlotSize => write!(f, "slot size not a power of two in {MIN_SLOT_SIZE}..={MAX_SLOT_SIZE}"),
            LayoutError::TooLarge => write!(f, "channel region too large"),
            LayoutError::Misaligned => write!(f, "channel base not page aligned"),
        }
    }
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Layout(e) => e.fmt(f),
            AttachError::BadMagic(m) => write!(f, "bad channel magic {m:#x}"),
            AttachError::BadVersion(v) => write!(f, "channel version {v}, expected {VERSION}"),
            AttachError::SizeMismatch { header, expected } => {
                write!(f, "channel header says size {header:#x}, expected {expected:#x}")
            }
            AttachError::SlotCountMismatch { header, expected } => {
                write!(f, "channel header says {header} slots, expected {expected}")
            }
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::CounterOutOfRange { seen, expected_from, expected_to } => {
                write!(f, "peer counter {seen} outside {expected_from}..={expected_to}")
            }
            Corruption::LengthTooLarge { length, max } => {
                write!(f, "message length {length} exceeds slot payload {max}")
            }
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Full => write!(f, "channel ring full"),
            SendError::TooLarge { length, max } => {
                write!(f, "message of {length} bytes exceeds {max}")
            }
            SendError::Corrupt(c) => c.fmt(f),
        }
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvError::BufferTooSmall { needed } => {
                write!(f, "receive buffer too small, message is {needed} bytes")
            }
            RecvError::Corrupt(c) => c.fmt(f),
        }
    }
}

/// A formatted, validated channel region. Cheap to copy; create endpoints from it.
#[derive(Clone, Copy, Debug)]
pub struct Channel {
    region: SharedRegion,
    layout: Layout,
}

impl Channel {
    /// Formats the region at `base` (host side) with the default slot size: zeroes the header
    /// and both rings' counters, then publishes the magic.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `size` bytes for as long as the channel or
    /// any endpoint made from it is used, and nobody else may use the region during `init`.
    /// Other parties may access it afterwards, with atomic or volatile accesses only.
    pub unsafe fn init(base: *mut u8, size: usize) -> Result<Channel, LayoutError> {
        // SAFETY: forwarded to the caller.
        unsafe { Channel::init_with_slot_size(base, size, DEFAULT_SLOT_SIZE) }
    }

    /// [`Channel::init`] with a chosen slot size (a power of two in 64..=4096).
    ///
    /// # Safety
    /// As for [`Channel::init`].
    pub unsafe fn init_with_slot_size(base: *mut u8, size: usize, slot_size: usize) -> Result<Channel, LayoutError> {
        let layout = Layout::new(size, slot_size)?;
        if base as usize % PAGE_SIZE != 0 {
            return Err(LayoutError::Misaligned);
        }
        // SAFETY: forwarded to the caller.
        let region = unsafe { SharedRegion::new(base, size) };
        // Offsets below are constants inside the header page, which `Layout::new` guarantees
        // exists, so the accessors cannot fail.
        region.u64_at(offsets::MAGIC).unwrap().store(0, Ordering::Relaxed);
        region.zero(0, HEADER_SIZE).unwrap();
        region.u32_at(offsets::VERSION).unwrap().store(VERSION, Ordering::Relaxed);
        region.u32_at(offsets::SLOT_SIZE).unwrap().store(slot_size as u32, Ordering::Relaxed);
        region.u64_at(offsets::REGION_SIZE).unwrap().store(size as u64, Ordering::Relaxed);
        region.u32_at(offsets::SLOTS).unwrap().store(layout.slots_per_ring as u32, Ordering::Relaxed);
        // Release: whoever sees the magic sees the fields above.
        region.u64_at(offsets::MAGIC).unwrap().store(MAGIC, Ordering::Release);
        Ok(Channel { region, layout })
    }

    /// Validates a region formatted by [`Channel::init`] (guest side, or a host process that
    /// received the region from the VMM).
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `size` bytes for as long as the channel or
    /// any endpoint made from it is used. Other parties may access it concurrently, with atomic
    /// or volatile accesses only.
    pub unsafe fn attach(base: *mut u8, size: usize) -> Result<Channel, AttachError> {
        if base as usize % PAGE_SIZE != 0 {
            return Err(AttachError::Layout(LayoutError::Misaligned));
        }
        if size < MIN_SIZE {
            return Err(AttachError::Layout(LayoutError::TooSmall));
        }
        // SAFETY: forwarded to the caller.
        let region = unsafe { SharedRegion::new(base, size) };
        let magic = region.u64_at(offsets::MAGIC).unwrap().load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(AttachError::BadMagic(magic));
        }
        let version = region.u32_at(offsets::VERSION).unwrap().load(Ordering::Relaxed);
        if version != VERSION {
            return Err(AttachError::BadVersion(version));
        }
        let header_size = region.u64_at(offsets::REGION_SIZE).unwrap().load(Ordering::Relaxed);
        if header_size != size as u64 {
            return Err(AttachError::SizeMismatch { header: header_size, expected: size as u64 });
        }
        let slot_size = region.u32_at(offsets::SLOT_SIZE).unwrap().load(Ordering::Relaxed);
        let layout = Layout::new(size, slot_size as usize).map_err(AttachError::Layout)?;
        let slots = region.u32_at(offsets::SLOTS).unwrap().load(Ordering::Relaxed);
        if slots as usize != layout.slots_per_ring {
            return Err(AttachError::SlotCountMismatch { header: slots, expected: layout.slots_per_ring as u32 });
        }
        Ok(Channel { region, layout })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The host's end: sends on the host→guest ring, receives on the guest→host ring.
    /// Use one host endpoint at a time (each ring has a single producer and a single consumer).
    pub fn host_end(&self) -> Result<Endpoint, Corruption> {
        Endpoint::new(
            self,
            Ring::new(self.layout, offsets::HOST_TO_GUEST, self.layout.host_to_guest_ring_offset()),
            Ring::new(self.layout, offsets::GUEST_TO_HOST, self.layout.guest_to_host_ring_offset()),
        )
    }

    /// The guest's end: sends on the guest→host ring, receives on the host→guest ring.
    pub fn guest_end(&self) -> Result<Endpoint, Corruption> {
        Endpoint::new(
            self,
            Ring::new(self.layout, offsets::GUEST_TO_HOST, self.layout.guest_to_host_ring_offset()),
            Ring::new(self.layout, offsets::HOST_TO_GUEST, self.layout.host_to_guest_ring_offset()),
        )
    }
}

/// One ring's geometry: its control words and where its slots start.
#[derive(Clone, Copy, Debug)]
struct Ring {
    control: RingControl,
    slots_offset: usize,
    slots: u64,
    slot_size: usize,
}

impl Ring {
    fn new(layout: Layout, control: RingControl, slots_offset: usize) -> Ring {
        Ring { control, slots_offset, slots: layout.slots_per_ring as u64, slot_size: layout.slot_size }
    }

    fn slot_offset(&self, counter: u64) -> usize {
        // The remainder is below `slots`, which came from a usize.
        self.slots_offset + (counter % self.slots) as usize * self.slot_size
    }
}

/// Checks that `seen` lies in `from..=to` in the counters' wrapping order, where `to - from`
/// never exceeds the ring size; anything else means the peer broke the protocol.
fn check_counter(seen: u64, from: u64, to: u64) -> Result<(), Corruption> {
    if seen.wrapping_sub(from) <= to.wrapping_sub(from) {
        Ok(())
    } else {
        Err(Corruption::CounterOutOfRange { seen, expected_from: from, expected_to: to })
    }
}

/// One side's view of the channel: a ring it produces into and a ring it consumes from.
#[derive(Debug)]
pub struct Endpoint {
    region: SharedRegion,
    tx: Ring,
    rx: Ring,
    /// Messages we have published on `tx` (our own counter, never read back from the region).
    tx_produced: u64,
    /// The peer's consumer counter on `tx` when we last looked.
    tx_consumed_seen: u64,
    /// Messages we have consumed from `rx` (our own counter).
    rx_consumed: u64,
    /// The peer's producer counter on `rx` when we last looked.
    rx_produced_seen: u64,
    max_message_len: usize,
}

impl Endpoint {
    fn new(channel: &Channel, tx: Ring, rx: Ring) -> Result<Endpoint, Corruption> {
        let region = channel.region;
        let load = |offset| region.u64_at(offset).unwrap().load(Ordering::Acquire);
        // Start from whatever the region says (an endpoint may be re-created, e.g. by a host
        // process that reconnects), but only if the counters are consistent.
        let tx_produced = load(tx.control.producer);
        let tx_consumed = load(tx.control.consumer);
        check_counter(tx_produced, tx_consumed, tx_consumed.wrapping_add(tx.slots))?;
        let rx_produced = load(rx.control.producer);
        let rx_consumed = load(rx.control.consumer);
        check_counter(rx_produced, rx_consumed, rx_consumed.wrapping_add(rx.slots))?;
        Ok(Endpoint {
            region,
            tx,
            rx,
            tx_produced,
            tx_consumed_seen: tx_consumed,
            rx_consumed,
            rx_produced_seen: rx_produced,
            max_message_len: channel.layout.max_message_len(),
        })
    }

    pub fn max_message_len(&self) -> usize {
        self.max_message_len
    }

    /// Messages each ring holds.
    pub fn capacity(&self) -> usize {
        self.tx.slots as usize
    }

    fn control_u64(&self, offset: usize) -> &core::sync::atomic::AtomicU64 {
        // Control offsets are constants inside the header page.
        self.region.u64_at(offset).unwrap()
    }

    fn control_u32(&self, offset: usize) -> &core::sync::atomic::AtomicU32 {
        self.region.u32_at(offset).unwrap()
    }

    /// Reads and validates the peer's consumer counter on our transmit ring.
    fn peer_consumed(&mut self) -> Result<u64, Corruption> {
        let consumed = self.control_u64(self.tx.control.consumer).load(Ordering::Acquire);
        check_counter(consumed, self.tx_consumed_seen, self.tx_produced)?;
        self.tx_consumed_seen = consumed;
        Ok(consumed)
    }

    /// Reads and validates the peer's producer counter on our receive ring.
    fn peer_produced(&mut self) -> Result<u64, Corruption> {
        let produced = self.control_u64(self.rx.control.producer).load(Ordering::Acquire);
        check_counter(produced, self.rx_produced_seen, self.rx_consumed.wrapping_add(self.rx.slots))?;
        self.rx_produced_seen = produced;
        Ok(produced)
    }

    /// [`Endpoint::send`], calling `wait` each time the ring is full and trying again while it
    /// says to (it sleeps, pauses or checks a deadline): `Full` once `wait` gave up.
    pub fn send_waiting(&mut self, message: &[u8], mut wait: impl FnMut() -> bool) -> Result<(), SendError> {
        loop {
            match self.send(message) {
                Err(SendError::Full) if wait() => {}
                sent => return sent,
            }
        }
    }

    /// Puts one message on the transmit ring. Afterwards, ring the peer's doorbell if
    /// [`Endpoint::peer_waiting`] says it sleeps.
    pub fn send(&mut self, message: &[u8]) -> Result<(), SendError> {
        if message.len() > self.max_message_len {
            return Err(SendError::TooLarge { length: message.len(), max: self.max_message_len });
        }
        let consumed = self.peer_consumed().map_err(SendError::Corrupt)?;
        if self.tx_produced.wrapping_sub(consumed) >= self.tx.slots {
            return Err(SendError::Full);
        }
        let slot = self.tx.slot_offset(self.tx_produced);
        // The slot lies inside the region by construction of the layout.
        self.region.write_bytes(slot + SLOT_HEADER_SIZE, message).unwrap();
        self.control_u32(slot).store(message.len() as u32, Ordering::Relaxed);
        self.control_u32(slot + 4).store(0, Ordering::Relaxed);
        self.tx_produced = self.tx_produced.wrapping_add(1);
        // Release: the consumer that sees the new counter sees the slot's contents.
        self.control_u64(self.tx.control.producer).store(self.tx_produced, Ordering::Release);
        // Order the publication before the caller's look at the peer's `waiting` flag; the
        // consumer does the mirror image (flag, fence, counter) in `set_waiting`.
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Takes the next message off the receive ring into `buffer`; `Ok(None)` if the ring is
    /// empty.
    pub fn recv(&mut self, buffer: &mut [u8]) -> Result<Option<usize>, RecvError> {
        let produced = self.peer_produced().map_err(RecvError::Corrupt)?;
        if produced == self.rx_consumed {
            return Ok(None);
        }
        let slot = self.rx.slot_offset(self.rx_consumed);
        // Read the length once: the peer may change it while we look.
        let length = self.control_u32(slot).load(Ordering::Relaxed);
        if length as usize > self.max_message_len {
            return Err(RecvError::Corrupt(Corruption::LengthTooLarge { length, max: self.max_message_len }));
        }
        let length = length as usize;
        if length > buffer.len() {
            return Err(RecvError::BufferTooSmall { needed: length });
        }
        self.region.read_bytes(slot + SLOT_HEADER_SIZE, &mut buffer[..length]).unwrap();
        self.rx_consumed = self.rx_consumed.wrapping_add(1);
        // Release: the producer may reuse the slot only after our reads above.
        self.control_u64(self.rx.control.consumer).store(self.rx_consumed, Ordering::Release);
        Ok(Some(length))
    }

    /// Whether a message is waiting on the receive ring (without taking it).
    pub fn has_message(&mut self) -> Result<bool, Corruption> {
        Ok(self.peer_produced()? != self.rx_consumed)
    }

    /// Tells the peer whether we are about to sleep on the receive ring. After setting it, check
    /// the ring again before sleeping.
    pub fn set_waiting(&self, waiting: bool) {
        self.control_u32(self.rx.control.waiting).store(waiting as u32, Ordering::SeqCst);
        // Order the flag before the re-check of the producer counter that follows.
        fence(Ordering::SeqCst);
    }

    /// Whether the peer sleeps waiting for messages on our transmit ring (so needs a doorbell).
    pub fn peer_waiting(&self) -> bool {
        self.control_u32(self.tx.control.waiting).load(Ordering::SeqCst) != 0
    }
}

#[cfg(test)]
mod tests;
