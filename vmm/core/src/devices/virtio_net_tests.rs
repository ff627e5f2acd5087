//! virtio-net against forged rings: what a driver does right is carried frame for frame, and
//! everything else (bad addresses, indices, chains, directions, lengths) stops the device with
//! NEEDS_RESET instead of the VMM, until a reset brings it back.

use std::collections::VecDeque;
use std::io;

use virtio_bindings::virtio_config::*;
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::virtio_net::*;

#[derive(Default)]
struct Fake {
    sent: Vec<Vec<u8>>,
    incoming: VecDeque<Vec<u8>>,
}

impl NetBackend for Fake {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.sent.push(frame.to_vec());
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        Ok(self.incoming.pop_front().map(|f| {
            buf[..f.len()].copy_from_slice(&f);
            f.len()
        }))
    }
}

const QUEUE_LEN: u16 = 16;
const RX_RING: u64 = 0x1000;
const TX_RING: u64 = 0x4000;
const BUFFERS: u64 = 0x10_0000;
const RAM: usize = 0x20_0000;
const MAC: [u8; 6] = [0x52, 0x54, 0, 0xc1, 0, 1];

struct Rig {
    mem: GuestMemoryMmap,
    /// (descriptor table, avail ring, used ring) of RX and TX.
    rings: [(u64, u64, u64); 2],
    net: VirtioNet<Fake>,
    irq: EventFd,
}

fn write(net: &mut VirtioNet<Fake>, reg: u32, value: u32) {
    net.write_register(reg as u64, &value.to_le_bytes());
}

fn read(net: &VirtioNet<Fake>, reg: u32) -> u32 {
    let mut data = [0u8; 4];
    net.read_register(reg as u64, &mut data);
    u32::from_le_bytes(data)
}

impl Rig {
    fn new() -> Rig {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let net = VirtioNet::new(mem.clone(), Fake::default(), MAC, irq.try_clone().unwrap());
        let mut rig = Rig { mem, net, irq, rings: [(0, 0, 0); 2] };
        rig.start();
        rig
    }

    /// What Linux's virtio_mmio + virtio_net drivers do at probe, with both queues set up.
    fn start(&mut self) {
        self.start_with(1 << (VIRTIO_F_VERSION_1 - 32));
    }

    fn start_with(&mut self, high_features: u32) {
        let net = &mut self.net;
        write(net, VIRTIO_MMIO_STATUS, 0);
        write(net, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
        write(net, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        write(net, VIRTIO_MMIO_DRIVER_FEATURES, high_features);
        write(net, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
        for (index, ring) in [(0, RX_RING), (1, TX_RING)] {
            // The mock lays the rings out (and zeroes their indices) once.
            let q = MockSplitQueue::create(&self.mem, GuestAddress(ring), QUEUE_LEN);
            self.rings[index as usize] = (q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0);
            write(net, VIRTIO_MMIO_QUEUE_SEL, index);
            write(net, VIRTIO_MMIO_QUEUE_NUM, QUEUE_LEN as u32);
            write(net, VIRTIO_MMIO_QUEUE_DESC_LOW, q.desc_table_addr().0 as u32);
            write(net, VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
            write(net, VIRTIO_MMIO_QUEUE_AVAIL_LOW, q.avail_addr().0 as u32);
            write(net, VIRTIO_MMIO_QUEUE_AVAIL_HIGH, 0);
            write(net, VIRTIO_MMIO_QUEUE_USED_LOW, q.used_addr().0 as u32);
            write(net, VIRTIO_MMIO_QUEUE_USED_HIGH, 0);
            write(net, VIRTIO_MMIO_QUEUE_READY, 1);
        }
        write(net, VIRTIO_MMIO_STATUS, read(net, VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_DRIVER_OK);
    }

    /// Stores descriptors at table slots `first..` and offers `heads` in the avail ring.
    fn forge(&self, index: usize, first: u16, descs: &[(u64, u32, u32, u16)], heads: &[u16]) {
        let (table, avail, _) = self.rings[index];
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&addr.to_le_bytes());
            raw[8..12].copy_from_slice(&len.to_le_bytes());
            raw[12..14].copy_from_slice(&(flags as u16).to_le_bytes());
            raw[14..].copy_from_slice(&next.to_le_bytes());
            self.mem.write_slice(&raw, GuestAddress(table + 16 * (first as u64 + i as u64))).unwrap();
        }
        let idx: u16 = self.mem.read_obj(GuestAddress(avail + 2)).unwrap();
        for (i, &head) in heads.iter().enumerate() {
            let slot = (idx as u64 + i as u64) % QUEUE_LEN as u64;
            self.mem.write_obj(head, GuestAddress(avail + 4 + 2 * slot)).unwrap();
        }
        self.set_avail_idx(index, idx.wrapping_add(heads.len() as u16));
    }

    fn set_avail_idx(&self, index: usize, idx: u16) {
        self.mem.write_obj(idx, GuestAddress(self.rings[index].1 + 2)).unwrap();
    }

    fn used(&self, index: usize) -> u16 {
        self.mem.read_obj(GuestAddress(self.rings[index].2 + 2)).unwrap()
    }

    /// The length of used element `i` of queue `index`.
    fn used_len(&self, index: usize, i: u64) -> u32 {
        self.mem.read_obj(GuestAddress(self.rings[index].2 + 4 + 8 * i + 4)).unwrap()
    }

    fn needs_reset(&self) -> bool {
        self.net.status() & VIRTIO_CONFIG_S_NEEDS_RESET != 0
    }

    /// A frame the guest sends: header at BUFFERS, payload after it, in two descriptors.
    fn send(&mut self, payload: &[u8]) {
        self.mem.write_slice(&[0; NET_HDR_LEN], GuestAddress(BUFFERS)).unwrap();
        self.mem.write_slice(payload, GuestAddress(BUFFERS + 0x100)).unwrap();
        self.forge(1, 0, &[(BUFFERS, NET_HDR_LEN as u32, VRING_DESC_F_NEXT, 1), (BUFFERS + 0x100, payload.len() as u32, 0, 0)], &[0]);
        self.net.notify(1);
    }
}

#[test]
fn identifies_as_a_virtio_1_net_device_with_its_mac() {
    let rig = Rig::new();
    assert_eq!(read(&rig.net, VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
    assert_eq!(read(&rig.net, VIRTIO_MMIO_VERSION), 2);
    assert_eq!(read(&rig.net, VIRTIO_MMIO_DEVICE_ID), 1);
    let mut mac = [0u8; 6];
    rig.net.read_register(VIRTIO_MMIO_CONFIG as u64, &mut mac);
    assert_eq!(mac, MAC);
    assert!(rig.net.status() & VIRTIO_CONFIG_S_DRIVER_OK != 0 && !rig.needs_reset());
}

#[test]
fn a_sent_frame_reaches_the_host_unchanged() {
    let mut rig = Rig::new();
    rig.send(b"an ethernet frame, 42 bytes of it.........");
    assert_eq!(rig.net.backend().sent, vec![b"an ethernet frame, 42 bytes of it.........".to_vec()]);
    assert_eq!(rig.used(1), 1);
    assert!(!rig.needs_reset());
}

#[test]
fn a_host_frame_lands_in_the_guests_buffer_behind_a_header() {
    let mut rig = Rig::new();
    let frame: Vec<u8> = (0..100u8).collect();
    rig.net.backend().incoming.push_back(frame.clone());
    // No buffer yet: the frame waits, nothing is lost.
    rig.net.host_ready();
    assert_eq!(rig.used(0), 0);
    rig.forge(0, 0, &[(BUFFERS, 40, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1), (BUFFERS + 0x1000, 1514, VRING_DESC_F_WRITE, 0)], &[0]);
    rig.net.notify(0);
    assert_eq!(rig.used(0), 1);
    assert_eq!(rig.used_len(0, 0), (NET_HDR_LEN + frame.len()) as u32);
    let mut header = [0u8; 40];
    rig.mem.read_slice(&mut header, GuestAddress(BUFFERS)).unwrap();
    assert_eq!(header[10], 1, "num_buffers");
    assert_eq!(&header[NET_HDR_LEN..], &frame[..40 - NET_HDR_LEN]);
    let mut rest = vec![0u8; frame.len() - (40 - NET_HDR_LEN)];
    rig.mem.read_slice(&mut rest, GuestAddress(BUFFERS + 0x1000)).unwrap();
    assert_eq!(rest, frame[40 - NET_HDR_LEN..]);
    assert_eq!(rig.irq.read().unwrap(), 1);
    assert_eq!(read(&rig.net, VIRTIO_MMIO_INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
}

/// Forges one bad TX or RX chain and checks the device refused it and came back after a reset.
fn refused(index: usize, descs: &[(u64, u32, u32, u16)], heads: &[u16]) {
    let mut rig = Rig::new();
    if index == 0 {
        rig.net.backend().incoming.push_back(vec![7; 60]);
    }
    rig.forge(index, 0, descs, heads);
    rig.net.notify(index);
    assert!(rig.needs_reset(), "{descs:?} {heads:?} was accepted");
    assert!(rig.net.backend().sent.is_empty());
    assert_eq!(read(&rig.net, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_CONFIG);
    // Stopped: a good frame now is not carried.
    rig.send(b"after the error");
    assert!(rig.net.backend().sent.is_empty());
    // The driver's reset brings it back, rings and all.
    for ring in [RX_RING, TX_RING] {
        rig.mem.write_slice(&[0u8; 0x1000], GuestAddress(ring)).unwrap();
    }
    rig.start();
    assert!(!rig.needs_reset());
    rig.send(b"after the reset");
    assert_eq!(rig.net.backend().sent, vec![b"after the reset".to_vec()]);
}

const W: u32 = VRING_DESC_F_WRITE;
const N: u32 = VRING_DESC_F_NEXT;

#[test]
fn a_buffer_outside_guest_ram_is_refused() {
    refused(1, &[(RAM as u64 - 4, 64, 0, 0)], &[0]);
    refused(1, &[(u64::MAX - 8, 64, 0, 0)], &[0]);
    refused(0, &[(RAM as u64 + 0x1000, 1526, W, 0)], &[0]);
}

#[test]
fn a_chain_with_a_bad_next_index_or_a_loop_is_refused() {
    refused(1, &[(BUFFERS, 12, N, 999)], &[0]);
    refused(1, &[(BUFFERS, 12, N, 1), (BUFFERS, 12, N, 0)], &[0]);
    refused(0, &[(BUFFERS, 1526, W | N, 0)], &[0]);
}

#[test]
fn a_head_beyond_the_table_is_refused() {
    refused(1, &[(BUFFERS, 64, 0, 0)], &[QUEUE_LEN]);
    refused(0, &[(BUFFERS, 1526, W, 0)], &[u16::MAX]);
}

#[test]
fn an_avail_index_more_than_a_queue_ahead_is_refused() {
    let mut rig = Rig::new();
    rig.forge(1, 0, &[(BUFFERS, 64, 0, 0)], &[0]);
    rig.set_avail_idx(1, QUEUE_LEN + 5);
    rig.net.notify(1);
    assert!(rig.needs_reset());
    assert!(rig.net.backend().sent.is_empty());
}

#[test]
fn buffers_the_wrong_way_are_refused() {
    refused(1, &[(BUFFERS, 12, N, 1), (BUFFERS + 0x100, 64, W, 0)], &[0]);
    refused(0, &[(BUFFERS, 1526, 0, 0)], &[0]);
}

#[test]
fn a_tx_chain_shorter_than_the_header_or_longer_than_a_frame_is_refused() {
    refused(1, &[(BUFFERS, 4, 0, 0)], &[0]);
    refused(1, &[(BUFFERS, 0x10_0000, 0, 0)], &[0]);
    refused(1, &[(BUFFERS, u32::MAX, N, 1), (BUFFERS, u32::MAX, 0, 0)], &[0]);
}

#[test]
fn rings_outside_guest_ram_are_refused_when_the_queue_is_made_ready() {
    let mut rig = Rig::new();
    write(&mut rig.net, VIRTIO_MMIO_STATUS, 0);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_SEL, 1);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_NUM, QUEUE_LEN as u32);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_DESC_LOW, 0);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_DESC_HIGH, 0x10);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_READY, 1);
    assert!(rig.needs_reset());
    assert_eq!(read(&rig.net, VIRTIO_MMIO_QUEUE_READY), 0);
}

#[test]
fn a_legacy_driver_is_refused() {
    let mut rig = Rig::new();
    rig.start_with(0);
    assert!(rig.needs_reset());
    rig.send(b"legacy");
    assert!(rig.net.backend().sent.is_empty());
}

#[test]
fn odd_register_accesses_are_ignored() {
    let mut rig = Rig::new();
    // Wrong widths, unknown offsets, a queue that does not exist, the config space written.
    rig.net.write_register(VIRTIO_MMIO_STATUS as u64, &[0]);
    rig.net.write_register(0x1f0, &[1, 2, 3, 4]);
    rig.net.write_register(VIRTIO_MMIO_CONFIG as u64, &[9; 4]);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_SEL, 7);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_READY, 1);
    write(&mut rig.net, VIRTIO_MMIO_QUEUE_NOTIFY, 7);
    assert_eq!(read(&rig.net, VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
    let mut wide = [0xffu8; 8];
    rig.net.read_register(VIRTIO_MMIO_MAGIC_VALUE as u64, &mut wide);
    assert_eq!(wide, [0; 8]);
    let mut beyond = [0xffu8; 4];
    rig.net.read_register(MMIO_SIZE - 4, &mut beyond);
    assert_eq!(beyond, [0; 4]);
    assert!(!rig.needs_reset());
    rig.send(b"still fine");
    assert_eq!(rig.net.backend().sent.len(), 1);
}

/// Before the driver starts the device, host frames are dropped, not left in the tap (where
/// they would keep the poll thread spinning through the guest's boot) nor delivered later.
#[test]
fn host_frames_before_the_driver_starts_are_dropped() {
    let mut rig = Rig::new();
    write(&mut rig.net, VIRTIO_MMIO_STATUS, 0);
    rig.net.backend().incoming.extend([b"early arp".to_vec(), b"another".to_vec()]);
    rig.net.host_ready();
    assert!(rig.net.backend().incoming.is_empty(), "the tap was drained");
    assert_eq!(rig.net.stats.dropped, 2);
    rig.start();
    rig.forge(0, 0, &[(BUFFERS, 1600, VRING_DESC_F_WRITE, 0)], &[0]);
    rig.net.notify(0);
    assert_eq!(rig.used(0), 0, "nothing from before the start arrives");
}
