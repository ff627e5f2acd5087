//! The enclave channel end to end: the test guest's echo server in polling and doorbell mode
//! (ioeventfd towards the host, irqfd + LAPIC interrupt towards the guest), its polling loop in
//! guest ring 3, and memory regions added at run time that the guest maps with its own page
//! tables.

#[macro_use]
mod guest_support;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use clowder_channel::Endpoint;
use guest_support::{eventfd_count_within, recv_within, send_within, sleep_announced, Guest, GuestSpec, GUEST_TIMEOUT};
use vmm::devices::ChannelEndpoint;
use vmm::RegionAccess;

const HOST_PATTERN: u64 = 0x1111_1111_0000_0000;
const GUEST_PATTERN: u64 = 0x2222_2222_0000_0000;

/// The host side of the conversation, in polling or sleeping style.
struct HostSide<'a> {
    endpoint: Endpoint,
    device: &'a ChannelEndpoint,
    /// Sleep on the doorbell eventfd (announcing it with `waiting`) instead of spinning.
    sleep: bool,
    doorbells_seen: u64,
}

impl<'a> HostSide<'a> {
    fn new(guest: &'a Guest, sleep: bool) -> HostSide<'a> {
        let device = guest.handle.channel().expect("the VM has a channel");
        let endpoint = device.channel().host_end().expect("consistent channel counters");
        HostSide { endpoint, device, sleep, doorbells_seen: 0 }
    }

    /// A spinning host side, returned once the guest reports its channel ready.
    fn once_ready(guest: &'a Guest) -> HostSide<'a> {
        let host = HostSide::new(guest, false);
        guest.wait_for_report("chready");
        host
    }

    fn send(&mut self, message: &[u8]) {
        send_within(&mut self.endpoint, message, GUEST_TIMEOUT);
        if self.endpoint.peer_waiting() {
            self.device.ring_guest().expect("raising the channel interrupt");
        }
    }

    /// Blocks until the doorbell eventfd fires or `timeout` passes; consumes the count.
    fn sleep_on_doorbell(&mut self, timeout: Duration) {
        self.doorbells_seen += eventfd_count_within(self.device.doorbell.as_raw_fd(), timeout);
    }

    fn wait_until_guest_waits(&self) {
        let deadline = Instant::now() + GUEST_TIMEOUT;
        while !self.endpoint.peer_waiting() {
            assert!(Instant::now() < deadline, "the guest never set its waiting flag");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn recv(&mut self) -> Vec<u8> {
        let HostSide { endpoint, device, sleep, doorbells_seen } = self;
        recv_within(endpoint, GUEST_TIMEOUT, |endpoint| {
            if *sleep {
                *doorbells_seen += sleep_announced(endpoint, device.doorbell.as_raw_fd(), Duration::from_secs(5));
            } else {
                std::thread::yield_now();
            }
        })
    }
}

impl HostSide<'_> {
    /// Like `recv`, but busy-polls without giving up the CPU: the setting in which a round
    /// trip is measured (both sides spin). `guest` is for the failure message.
    fn recv_spinning(&mut self, guest: &Guest) -> Vec<u8> {
        let deadline = Instant::now() + GUEST_TIMEOUT;
        let mut buffer = [0u8; 256];
        let mut polls = 0u64;
        loop {
            if let Some(length) = self.endpoint.recv(&mut buffer).expect("a well-formed ring") {
                return buffer[..length].to_vec();
            }
            polls += 1;
            // Reading the clock costs more than a poll; look only now and then.
            if polls % 65536 == 0 {
                assert!(Instant::now() < deadline, "no reply from the guest within {GUEST_TIMEOUT:?}; serial:\n{}", guest.serial());
            }
            std::hint::spin_loop();
        }
    }
}

fn message(index: usize) -> Vec<u8> {
    let length = 1 + (index * 53) % 248;
    (0..length).map(|i| (i + index) as u8).collect()
}

/// Messages the doorbell test sends only once the guest sleeps.
const ASLEEP_MESSAGES: usize = 5;

fn echo_session(mode: &str, sleep: bool) -> (guest_support::Finished, u64) {
    let guest = Guest::start(GuestSpec::new(&format!("test=channel mode={mode}")));
    let mut host = HostSide::new(&guest, sleep);
    const MESSAGES: usize = 40;
    // One at a time, then a burst (within the ring's capacity) so replies queue up.
    for index in 0..MESSAGES / 2 {
        host.send(&message(index));
        assert_eq!(host.recv(), message(index));
    }
    for index in MESSAGES / 2..MESSAGES {
        host.send(&message(index));
    }
    for index in MESSAGES / 2..MESSAGES {
        assert_eq!(host.recv(), message(index), "echo {index}");
    }
    if sleep {
        // Wait until the guest has announced it sleeps and has had time to reach `hlt` (10 ms
        // is ~40,000 emulated instructions), so these messages can only reach it through the
        // channel interrupt.
        for index in 0..ASLEEP_MESSAGES {
            host.wait_until_guest_waits();
            std::thread::sleep(Duration::from_millis(10));
            host.send(&message(index));
            assert_eq!(host.recv(), message(index));
        }
    }
    host.send(b"quit");
    assert_eq!(host.recv(), b"bye");
    let doorbells = host.doorbells_seen;
    let done = guest.finish();
    done.assert_exit(0);
    let expected_echoes = MESSAGES + if sleep { ASLEEP_MESSAGES } else { 0 };
    assert_eq!(done.value("echoed"), expected_echoes as u64, "{done}");
    (done, doorbells)
}

#[test]
fn channel_echo_in_polling_mode() {
    require_kvm!();
    let (done, _) = echo_session("poll", false);
    assert_eq!(done.value("wakeups"), 0, "a polling guest takes no channel interrupts\n{done}");
    assert!(done.serial.contains("polling mode"), "{done}");
}

#[test]
fn channel_echo_in_doorbell_mode_sleeps_and_wakes_both_sides() {
    require_kvm!();
    let (done, doorbells) = echo_session("doorbell", true);
    // The guest slept on hlt and our irqfd woke it; we slept on the eventfd and its port write
    // woke us.
    assert!(
        done.value("wakeups") >= ASLEEP_MESSAGES as u64,
        "the sleeping guest was not woken by the channel vector for each message\n{done}"
    );
    assert!(doorbells >= 1, "the guest never rang the doorbell while we slept");
    assert!(done.serial.contains("doorbell mode"), "{done}");
    // The doorbell is an ioeventfd: its writes never reach the VMM's port handlers.
    eprintln!("doorbell mode: {} guest wakeups, {doorbells} doorbells, exits {:?}", done.value("wakeups"), done.exit_counters);
}

/// The echo loop in guest ring 3 (`mode=poll-user`), which PVM runs natively instead of
/// emulating it: 1000 echoes with both sides spinning (the median round trip is printed, not
/// asserted: it depends on the machine), then a few with the host asleep on the doorbell, which
/// the guest must ring from ring 3 (IOPL 3), then `quit`, answered from ring 3 as well.
#[test]
fn channel_echo_with_a_ring3_poller() {
    require_kvm!();
    let guest = Guest::start(GuestSpec::new("test=channel mode=poll-user"));
    let mut host = HostSide::once_ready(&guest);
    const ECHOES: usize = 1000;
    let mut round_trips = Vec::with_capacity(ECHOES);
    for index in 0..ECHOES {
        let sent = message(index);
        let start = Instant::now();
        host.send(&sent);
        let reply = host.recv_spinning(&guest);
        round_trips.push(start.elapsed());
        assert_eq!(reply, sent, "echo {index}");
    }
    round_trips.sort();
    eprintln!(
        "ring-3 poller: channel round trip median {:?} (min {:?}, 90th percentile {:?}) over {ECHOES} echoes, host spinning",
        round_trips[ECHOES / 2],
        round_trips[0],
        round_trips[ECHOES * 9 / 10]
    );

    // The host announces it sleeps before each message, so every reply needs the doorbell.
    for index in 0..ASLEEP_MESSAGES {
        host.endpoint.set_waiting(true);
        host.send(&message(index));
        let deadline = Instant::now() + GUEST_TIMEOUT;
        while !host.endpoint.has_message().unwrap() {
            assert!(Instant::now() < deadline, "no reply while the host slept; guest serial:\n{}", guest.serial());
            host.sleep_on_doorbell(Duration::from_secs(5));
        }
        host.endpoint.set_waiting(false);
        assert_eq!(host.recv(), message(index));
    }
    assert!(host.doorbells_seen >= 1, "the ring-3 loop never rang the doorbell while we slept");

    // `map` needs ring 0: refused, and the loop keeps serving.
    host.send(b"map 100000000 1000");
    assert_eq!(host.recv(), b"error map needs ring 0");

    host.send(b"quit");
    assert_eq!(host.recv(), b"bye");
    let doorbells = host.doorbells_seen;
    let done = guest.finish();
    done.assert_exit(0);
    assert_eq!(done.value("echoed"), (ECHOES + ASLEEP_MESSAGES) as u64, "{done}");
    assert_eq!(done.value("wakeups"), 0, "a polling guest takes no channel interrupts\n{done}");
    assert!(done.serial.contains("ring-3 polling mode"), "{done}");
    eprintln!("ring-3 poller: {doorbells} doorbells while the host slept, exits {:?}", done.exit_counters);
}

/// A memfd of `len` bytes filled with the host pattern.
fn patterned_memfd(len: usize) -> (OwnedFd, *mut u64) {
    // SAFETY: plain syscalls; results checked.
    unsafe {
        let fd = libc::memfd_create(c"clowder-test-region".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED);
        let words = map as *mut u64;
        for index in 0..len / 8 {
            words.add(index).write_volatile(HOST_PATTERN | index as u64);
        }
        (fd, words)
    }
}

/// The guest writes its pattern into the first and last word of every page.
fn count_guest_pattern_mismatches(words: *mut u64, len: usize) -> usize {
    const WORDS_PER_PAGE: usize = 4096 / 8;
    (0..len / 4096)
        .flat_map(|page| [page * WORDS_PER_PAGE, (page + 1) * WORDS_PER_PAGE - 1])
        // SAFETY: `words` maps `len` bytes (see `patterned_memfd`).
        .filter(|&index| unsafe { words.add(index).read_volatile() } != GUEST_PATTERN | index as u64)
        .count()
}

#[test]
fn region_added_at_run_time_is_mapped_read_and_written_by_the_guest() {
    require_kvm!();
    let guest = Guest::start(GuestSpec::new("test=region"));
    let mut host = HostSide::once_ready(&guest);

    // Wherever the VMM puts it (just above RAM) ...
    const FIRST_LEN: usize = 64 * 1024;
    let (first_fd, first_words) = patterned_memfd(FIRST_LEN);
    let first = guest.handle.add_region(first_fd.as_raw_fd(), 0, FIRST_LEN as u64, None, RegionAccess::ReadWrite).expect("add_region");
    host.send(format!("map {:x} {:x}", first.gpa, first.len).as_bytes());
    let reply = String::from_utf8(host.recv()).unwrap();
    assert_eq!(reply, format!("mapped {:x} {:x} bad 0", first.gpa, first.len));
    assert_eq!(count_guest_pattern_mismatches(first_words, FIRST_LEN), 0, "the guest's writes reached the memfd");

    // ... and above the 4 GiB the boot page tables identity-map.
    const SECOND_GPA: u64 = 0x2_0000_0000;
    const SECOND_LEN: usize = 2 * 1024 * 1024 + 8192;
    let (second_fd, second_words) = patterned_memfd(SECOND_LEN);
    let second = guest
        .handle
        .add_region(second_fd.as_raw_fd(), 0, SECOND_LEN as u64, Some(SECOND_GPA), RegionAccess::ReadWrite)
        .expect("add_region above 4 GiB");
    assert_eq!(second.gpa, SECOND_GPA);
    host.send(format!("map {SECOND_GPA:x} {SECOND_LEN:x}").as_bytes());
    assert_eq!(String::from_utf8(host.recv()).unwrap(), format!("mapped {SECOND_GPA:x} {SECOND_LEN:x} bad 0"));
    assert_eq!(count_guest_pattern_mismatches(second_words, SECOND_LEN), 0);

    // A region of a GiB or more goes at a 1 GiB boundary, so the guest can use 1 GiB pages.
    // SAFETY: plain syscall; the result is checked and owned.
    let big = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"clowder-test-big".as_ptr(), libc::MFD_CLOEXEC)) };
    std::fs::File::from(big.try_clone().unwrap()).set_len(1 << 30).unwrap();
    let placed = guest.handle.add_region(big.as_raw_fd(), 0, 1 << 30, None, RegionAccess::ReadWrite).expect("add_region of 1 GiB");
    assert_eq!(placed.gpa % (1 << 30), 0, "{placed:?}");
    guest.handle.remove_region(placed.slot).expect("remove_region");

    // Requests the guest must refuse without falling over.
    host.send(b"map 1001 1000");
    assert_eq!(host.recv(), b"error Unaligned");
    host.send(b"map 200000000 1000000");
    assert_eq!(host.recv(), b"error TooLarge");
    host.send(b"map nonsense");
    assert_eq!(host.recv(), b"error bad map request");

    host.send(b"quit");
    assert_eq!(host.recv(), b"bye");
    let done = guest.finish();
    done.assert_exit(0);
    assert_eq!(done.values("rgn_gpa"), vec![first.gpa, SECOND_GPA], "{done}");
    assert_eq!(done.values("rgn_bad"), vec![0, 0]);
    // SAFETY: unmapping the test's own mappings.
    unsafe {
        libc::munmap(first_words.cast(), FIRST_LEN);
        libc::munmap(second_words.cast(), SECOND_LEN);
    }
}
