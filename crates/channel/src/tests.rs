use super::*;
use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::vec::Vec;

/// A page-aligned, zeroed heap buffer standing in for guest memory.
struct TestRegion {
    base: *mut u8,
    alloc_layout: AllocLayout,
}

unsafe impl Send for TestRegion {}
unsafe impl Sync for TestRegion {}

impl TestRegion {
    fn new(size: usize) -> TestRegion {
        let alloc_layout = AllocLayout::from_size_align(size, PAGE_SIZE).unwrap();
        // SAFETY: the layout's size is not zero.
        let base = unsafe { alloc_zeroed(alloc_layout) };
        assert!(!base.is_null());
        TestRegion { base, alloc_layout }
    }

    fn size(&self) -> usize {
        self.alloc_layout.size()
    }

    fn init(&self) -> Channel {
        // SAFETY: the region is ours, page-aligned and `size()` long (as every use below).
        unsafe { Channel::init(self.base, self.size()) }.unwrap()
    }

    fn attach(&self) -> Result<Channel, AttachError> {
        // SAFETY: as in `init`.
        unsafe { Channel::attach(self.base, self.size()) }
    }

    /// A region of `size` holding a fresh channel, the channel's host end, and the guest end
    /// of an attach as a guest makes.
    fn with_ends(size: usize) -> (TestRegion, Endpoint, Endpoint) {
        let region = TestRegion::new(size);
        let (host, guest) = (region.init().host_end().unwrap(), region.attach().unwrap().guest_end().unwrap());
        (region, host, guest)
    }

    /// Plays the misbehaving peer: writes a word of the region directly.
    fn poke_u64(&self, offset: usize, value: u64) {
        // SAFETY: offsets the tests pass are aligned and inside the region (as below).
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }.store(value, Ordering::SeqCst);
    }

    fn poke_u32(&self, offset: usize, value: u32) {
        // SAFETY: as in `poke_u64`.
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }.store(value, Ordering::SeqCst);
    }

    fn peek_u64(&self, offset: usize) -> u64 {
        // SAFETY: as in `poke_u64`.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }.load(Ordering::SeqCst)
    }
}

impl Drop for TestRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.base, self.alloc_layout) }
    }
}

fn message(index: usize, max: usize) -> Vec<u8> {
    let length = (index * 37) % (max + 1);
    (0..length).map(|i| (i ^ index) as u8).collect()
}

#[test]
fn default_layout_geometry() {
    let layout = Layout::new(DEFAULT_SIZE, DEFAULT_SLOT_SIZE).unwrap();
    assert_eq!(layout.slots_per_ring, 120);
    assert_eq!(layout.max_message_len(), 248);
    assert_eq!(layout.guest_to_host_ring_offset(), 0x1000);
    assert_eq!(layout.host_to_guest_ring_offset(), 0x1000 + 120 * 256);
    assert!(layout.host_to_guest_ring_offset() + 120 * 256 <= DEFAULT_SIZE);
    assert_eq!(Layout::new(MIN_SIZE, 256).unwrap().slots_per_ring, 16);
}

#[test]
fn layout_rejects_bad_geometry() {
    assert_eq!(Layout::new(2 * PAGE_SIZE, 256), Err(LayoutError::TooSmall));
    assert_eq!(Layout::new(MIN_SIZE + 1, 256), Err(LayoutError::NotPageMultiple));
    assert_eq!(Layout::new(MIN_SIZE, 100), Err(LayoutError::BadSlotSize));
    assert_eq!(Layout::new(MIN_SIZE, 32), Err(LayoutError::BadSlotSize));
    assert_eq!(Layout::new(MIN_SIZE, 8192), Err(LayoutError::BadSlotSize));
}

#[test]
fn attach_validates_header() {
    let region = TestRegion::new(DEFAULT_SIZE);
    assert_eq!(region.attach().unwrap_err(), AttachError::BadMagic(0));
    region.init();
    let channel = region.attach().unwrap();
    assert_eq!(channel.layout(), Layout::new(DEFAULT_SIZE, DEFAULT_SLOT_SIZE).unwrap());

    // SAFETY: inside the test region.
    let too_small = unsafe { Channel::attach(region.base, 2 * PAGE_SIZE) };
    assert_eq!(too_small.unwrap_err(), AttachError::Layout(LayoutError::TooSmall));
    // SAFETY: inside the test region.
    let shifted = unsafe { Channel::attach(region.base.add(8), MIN_SIZE) };
    assert_eq!(shifted.unwrap_err(), AttachError::Layout(LayoutError::Misaligned));
    // SAFETY: inside the test region.
    let smaller = unsafe { Channel::attach(region.base, MIN_SIZE) };
    assert!(matches!(smaller.unwrap_err(), AttachError::SizeMismatch { .. }));

    region.poke_u32(offsets::SLOTS, 121);
    assert!(matches!(region.attach().unwrap_err(), AttachError::SlotCountMismatch { .. }));
    region.poke_u32(offsets::SLOTS, 120);
    region.poke_u32(offsets::SLOT_SIZE, 3);
    assert_eq!(region.attach().unwrap_err(), AttachError::Layout(LayoutError::BadSlotSize));
    region.poke_u32(offsets::SLOT_SIZE, 256);
    region.poke_u32(offsets::VERSION, 2);
    assert_eq!(region.attach().unwrap_err(), AttachError::BadVersion(2));
}

#[test]
fn round_trip_both_directions() {
    let (_region, mut host, mut guest) = TestRegion::with_ends(DEFAULT_SIZE);
    let mut buffer = [0u8; 256];

    assert_eq!(host.recv(&mut buffer), Ok(None));
    assert_eq!(guest.recv(&mut buffer), Ok(None));

    host.send(b"hello guest").unwrap();
    assert_eq!(guest.recv(&mut buffer), Ok(Some(11)));
    assert_eq!(&buffer[..11], b"hello guest");
    assert_eq!(guest.recv(&mut buffer), Ok(None));

    guest.send(b"hello host!").unwrap();
    assert_eq!(host.recv(&mut buffer), Ok(Some(11)));
    assert_eq!(&buffer[..11], b"hello host!");

    // Empty and maximum-length messages, and an odd length that exercises the byte tail.
    let longest: Vec<u8> = (0..248).map(|i| i as u8).collect();
    host.send(&[]).unwrap();
    host.send(&longest).unwrap();
    host.send(&longest[..13]).unwrap();
    assert_eq!(guest.recv(&mut buffer), Ok(Some(0)));
    assert_eq!(guest.recv(&mut buffer), Ok(Some(248)));
    assert_eq!(&buffer[..248], &longest[..]);
    assert_eq!(guest.recv(&mut buffer), Ok(Some(13)));
    assert_eq!(&buffer[..13], &longest[..13]);
}

#[test]
fn too_large_and_small_buffer() {
    let (_region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    assert_eq!(host.send(&[0u8; 249]), Err(SendError::TooLarge { length: 249, max: 248 }));

    host.send(&[7u8; 100]).unwrap();
    let mut small = [0u8; 10];
    assert_eq!(guest.recv(&mut small), Err(RecvError::BufferTooSmall { needed: 100 }));
    // The message stayed in the ring.
    let mut big = [0u8; 100];
    assert_eq!(guest.recv(&mut big), Ok(Some(100)));
    assert_eq!(big, [7u8; 100]);
}

/// `send_waiting` tries again after each `wait` that says to, and gives up with `Full` when
/// one does not.
#[test]
fn send_waiting_waits_while_the_ring_is_full() {
    let (_region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    for _ in 0..guest.capacity() {
        guest.send(b"f").unwrap();
    }
    let mut waits = 0;
    assert_eq!(
        guest.send_waiting(b"late", || {
            waits += 1;
            waits < 3
        }),
        Err(SendError::Full)
    );
    assert_eq!(waits, 3);
    // The peer drains a slot during the first wait: the send after it succeeds.
    let mut buffer = [0u8; 8];
    assert_eq!(guest.send_waiting(b"late", || host.recv(&mut buffer) == Ok(Some(1))), Ok(()));
}

#[test]
fn full_ring_then_drain() {
    let (_region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    let capacity = guest.capacity();
    assert_eq!(capacity, 16);
    for i in 0..capacity {
        guest.send(&[i as u8]).unwrap();
    }
    assert_eq!(guest.send(b"one too many"), Err(SendError::Full));

    let mut buffer = [0u8; 8];
    assert_eq!(host.recv(&mut buffer), Ok(Some(1)));
    assert_eq!(buffer[0], 0);
    guest.send(b"x").unwrap();
    assert_eq!(guest.send(b"y"), Err(SendError::Full));
    for i in 1..capacity {
        assert_eq!(host.recv(&mut buffer), Ok(Some(1)));
        assert_eq!(buffer[0], i as u8);
    }
    assert_eq!(host.recv(&mut buffer), Ok(Some(1)));
    assert_eq!(buffer[0], b'x');
    assert_eq!(host.recv(&mut buffer), Ok(None));
}

#[test]
fn wraps_around_many_times() {
    let (_region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    let max = host.max_message_len();
    let mut buffer = [0u8; 256];
    let mut sent = 0;
    let mut received = 0;
    // Uneven batches so the full/empty boundaries land on every slot.
    for round in 0..200 {
        let batch = 1 + round % 16;
        for _ in 0..batch {
            match host.send(&message(sent, max)) {
                Ok(()) => sent += 1,
                Err(SendError::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        for _ in 0..(1 + round % 11) {
            match guest.recv(&mut buffer).unwrap() {
                Some(length) => {
                    assert_eq!(&buffer[..length], &message(received, max)[..]);
                    received += 1;
                }
                None => break,
            }
        }
    }
    while let Some(length) = guest.recv(&mut buffer).unwrap() {
        assert_eq!(&buffer[..length], &message(received, max)[..]);
        received += 1;
    }
    assert_eq!(sent, received);
    assert!(sent > 10 * host.capacity());
}

#[test]
fn endpoints_resume_from_the_region() {
    let region = TestRegion::new(MIN_SIZE);
    let channel = region.init();
    let mut host = channel.host_end().unwrap();
    host.send(b"first").unwrap();
    // A new host endpoint (a reconnecting host process) continues the same counters.
    let mut host = channel.host_end().unwrap();
    host.send(b"second").unwrap();
    let mut guest = region.attach().unwrap().guest_end().unwrap();
    let mut buffer = [0u8; 16];
    assert_eq!(guest.recv(&mut buffer), Ok(Some(5)));
    assert_eq!(guest.recv(&mut buffer), Ok(Some(6)));
    assert_eq!(&buffer[..6], b"second");
}

#[test]
fn waiting_flags() {
    let (region, host, guest) = TestRegion::with_ends(MIN_SIZE);
    assert!(!host.peer_waiting());
    assert!(!guest.peer_waiting());
    guest.set_waiting(true);
    assert!(host.peer_waiting());
    assert!(!guest.peer_waiting());
    host.set_waiting(true);
    assert!(guest.peer_waiting());
    guest.set_waiting(false);
    assert!(!host.peer_waiting());
    // Any non-zero value the peer writes counts as waiting.
    region.poke_u32(offsets::HOST_TO_GUEST.waiting, 0xdead);
    assert!(host.peer_waiting());
}

/// The guest writes `producer` as its guest-to-host producer counter; what the host's next
/// receive says.
fn recv_after_producer(region: &TestRegion, host: &mut Endpoint, producer: u64) -> Result<Option<usize>, RecvError> {
    region.poke_u64(offsets::GUEST_TO_HOST.producer, producer);
    host.recv(&mut [0u8; 256])
}

/// The guest writes `consumer` as its host-to-guest consumer counter; what the host's next send
/// says.
fn send_after_consumer(region: &TestRegion, host: &mut Endpoint, consumer: u64) -> Result<(), SendError> {
    region.poke_u64(offsets::HOST_TO_GUEST.consumer, consumer);
    host.send(b"4")
}

#[test]
fn producer_counter_too_far_ahead_is_corrupt() {
    let region = TestRegion::new(MIN_SIZE);
    let mut host = region.init().host_end().unwrap();
    assert!(matches!(recv_after_producer(&region, &mut host, 17), Err(RecvError::Corrupt(Corruption::CounterOutOfRange { seen: 17, .. }))));
    assert!(matches!(recv_after_producer(&region, &mut host, u64::MAX), Err(RecvError::Corrupt(_))));
    // Exactly a full ring is legal (zero-length messages in zeroed slots).
    assert_eq!(recv_after_producer(&region, &mut host, 16), Ok(Some(0)));
}

#[test]
fn producer_counter_moving_backwards_is_corrupt() {
    let (region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    for _ in 0..3 {
        guest.send(b"abc").unwrap();
    }
    assert_eq!(host.recv(&mut [0u8; 256]), Ok(Some(3)));
    // Host has seen producer 3 and consumed 1; producer 2 is behind what it saw.
    assert!(matches!(recv_after_producer(&region, &mut host, 2), Err(RecvError::Corrupt(Corruption::CounterOutOfRange { seen: 2, .. }))));
    assert!(matches!(host.has_message(), Err(Corruption::CounterOutOfRange { .. })));
    // Once the peer behaves again, so does the channel.
    assert_eq!(recv_after_producer(&region, &mut host, 3), Ok(Some(3)));
}

#[test]
fn consumer_counter_out_of_range_is_corrupt() {
    let (region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    host.send(b"1").unwrap();
    host.send(b"2").unwrap();
    guest.recv(&mut [0u8; 256]).unwrap();
    host.send(b"3").unwrap();
    // The guest claims to have consumed more than the host produced.
    assert!(matches!(send_after_consumer(&region, &mut host, 4), Err(SendError::Corrupt(Corruption::CounterOutOfRange { seen: 4, .. }))));
    // ... or moves its consumer backwards.
    assert!(matches!(send_after_consumer(&region, &mut host, 0), Err(SendError::Corrupt(_))));
    assert_eq!(send_after_consumer(&region, &mut host, 1), Ok(()));
}

#[test]
fn oversized_length_is_corrupt() {
    let (region, mut host, mut guest) = TestRegion::with_ends(MIN_SIZE);
    let mut buffer = [0u8; 4096];
    guest.send(b"fine").unwrap();
    let slot = region.attach().unwrap().layout().guest_to_host_ring_offset();
    for bad_length in [249u32, 256, 4096, u32::MAX] {
        region.poke_u32(slot, bad_length);
        assert_eq!(host.recv(&mut buffer), Err(RecvError::Corrupt(Corruption::LengthTooLarge { length: bad_length, max: 248 })));
    }
    region.poke_u32(slot, 4);
    assert_eq!(host.recv(&mut buffer), Ok(Some(4)));
    assert_eq!(&buffer[..4], b"fine");
}

#[test]
fn inconsistent_counters_refuse_an_endpoint() {
    let region = TestRegion::new(MIN_SIZE);
    let channel = region.init();
    region.poke_u64(offsets::HOST_TO_GUEST.producer, 100);
    assert!(channel.host_end().is_err());
    assert!(channel.guest_end().is_err());
}

#[test]
fn random_garbage_never_panics() {
    let region = TestRegion::new(MIN_SIZE);
    let channel = region.init();
    let mut host = channel.host_end().unwrap();
    let mut buffer = [0u8; 300];
    let mut rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.u64(..);
    let control_words = [
        offsets::GUEST_TO_HOST.producer,
        offsets::GUEST_TO_HOST.consumer,
        offsets::HOST_TO_GUEST.producer,
        offsets::HOST_TO_GUEST.consumer,
    ];
    let slot_area = HEADER_SIZE..MIN_SIZE;
    for _ in 0..20_000 {
        let choice = next();
        match choice % 4 {
            0 => {
                // Small moves are the interesting ones: they pass some checks but not others.
                let word = control_words[(choice >> 8) as usize % control_words.len()];
                let delta = (next() % 40) as i64 - 20;
                region.poke_u64(word, region.peek_u64(word).wrapping_add(delta as u64));
            }
            1 => {
                let offset = slot_area.start + (next() as usize % slot_area.len()) / 4 * 4;
                region.poke_u32(offset, next() as u32 % 300);
            }
            2 => {
                let _ = host.send(&buffer[..(next() % 260) as usize]);
            }
            _ => {
                if let Ok(Some(length)) = host.recv(&mut buffer) {
                    assert!(length <= 248);
                }
            }
        }
        let _ = host.peer_waiting();
        let _ = channel.guest_end();
    }
}

/// Runs `host` with the host end of a new `size`-byte region while `guest` runs with its guest
/// end in another thread (which holds the region too: a host that fails leaves it running).
fn host_and_guest_thread(size: usize, host: impl FnOnce(Endpoint), guest: impl FnOnce(Endpoint) + Send + 'static) {
    let region = std::sync::Arc::new(TestRegion::new(size));
    let host_end = region.init().host_end().unwrap();
    let guest_region = region.clone();
    let guest = std::thread::spawn(move || guest(guest_region.attach().unwrap().guest_end().unwrap()));
    host(host_end);
    guest.join().unwrap();
}

#[test]
fn two_threads_ping_pong_100k_messages() {
    const ROUND_TRIPS: u64 = 100_000;
    let guest = move |mut guest: Endpoint| {
        let mut buffer = [0u8; 256];
        let mut echoed = 0u64;
        while echoed < ROUND_TRIPS {
            match guest.recv(&mut buffer).unwrap() {
                Some(length) => {
                    assert_eq!(length, 8);
                    let value = u64::from_le_bytes(buffer[..8].try_into().unwrap());
                    assert_eq!(value, echoed);
                    while guest.send(&(value + 1).to_le_bytes()) == Err(SendError::Full) {
                        std::thread::yield_now();
                    }
                    echoed += 1;
                }
                None => std::thread::yield_now(),
            }
        }
    };
    let host = |mut host: Endpoint| {
        let mut buffer = [0u8; 256];
        for value in 0..ROUND_TRIPS {
            host.send(&value.to_le_bytes()).unwrap();
            let length = loop {
                match host.recv(&mut buffer).unwrap() {
                    Some(length) => break length,
                    None => std::thread::yield_now(),
                }
            };
            assert_eq!(length, 8);
            assert_eq!(u64::from_le_bytes(buffer[..8].try_into().unwrap()), value + 1);
        }
    };
    host_and_guest_thread(DEFAULT_SIZE, host, guest);
}

#[test]
fn two_threads_stream_with_full_rings() {
    // One-way bursts that keep the ring full, so the producer's view of the consumer counter
    // is exercised under real concurrency.
    const MESSAGES: usize = 50_000;
    let guest = |mut guest: Endpoint| {
        let max = guest.max_message_len();
        let mut buffer = [0u8; 256];
        let mut received = 0;
        while received < MESSAGES {
            match guest.recv(&mut buffer).unwrap() {
                Some(length) => {
                    assert_eq!(&buffer[..length], &message(received, max)[..]);
                    received += 1;
                }
                None => std::thread::yield_now(),
            }
        }
    };
    let host = |mut host: Endpoint| {
        let max = host.max_message_len();
        for index in 0..MESSAGES {
            let payload = message(index, max);
            loop {
                match host.send(&payload) {
                    Ok(()) => break,
                    Err(SendError::Full) => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
        }
    };
    host_and_guest_thread(MIN_SIZE, host, guest);
}
