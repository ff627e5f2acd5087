//! virtio-net (virtio 1.x, split rings) over virtio-mmio, backed by a host tap, so a Linux VM
//! reaches the node's network. virtio-mmio rather than virtio-pci: the guest kernel finds it by a
//! `virtio_mmio.device=` command-line word, with no capability lists, BARs or MSI-X to model
//! beside the XEMEM PCI function, and its interrupt is one IOAPIC pin through an irqfd.
//!
//! The rings are parsed by rust-vmm's `virtio-queue`. Everything in them is the guest's and
//! untrusted: a bad ring address, avail index, descriptor chain, direction or length is a
//! `RingError`, which sets DEVICE_NEEDS_RESET, raises a configuration interrupt and stops the
//! device until the driver resets it (status 0). It never stops the VM or the VMM. No offloads are
//! offered, so every frame is a plain Ethernet frame behind a 12-byte `virtio_net_hdr_v1`.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MAC;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
use crate::VmError;

use super::{DeviceEnv, Tap};

/// The register window's size.
pub const MMIO_SIZE: u64 = 0x200;
const QUEUE_MAX: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
/// `virtio_net_hdr_v1`, before every frame in both directions once VERSION_1 is negotiated.
pub const NET_HDR_LEN: usize = 12;
/// The largest frame either way: no GSO is offered, so one MTU-sized Ethernet frame with a VLAN
/// tag; the tap is read into a buffer this big.
pub const MAX_FRAME: usize = 1522;
const MAGIC: u32 = 0x7472_6976;
/// "clow", little-endian.
const VENDOR: u32 = 0x776f_6c63;
const FEATURES: u64 = (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC);

/// Where frames go to and come from on the host.
pub trait NetBackend: Send {
    /// Sends one Ethernet frame.
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// One waiting frame into `buf`, or None when there is none.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
}

/// Something the guest put in a ring or a register that the device refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The queue's ring addresses or size do not lie in guest RAM or are misaligned.
    BadQueue { queue: usize },
    /// The avail index is unreadable or more than a queue ahead of the device.
    AvailIndex { queue: usize, detail: String },
    /// A chain is empty, cut short (bad next index, loop, bad indirect table) or too long.
    BadChain { queue: usize, head: u16 },
    /// A descriptor points the wrong way (a writable one in TX, a readable one in RX).
    Direction { queue: usize, head: u16 },
    /// A buffer lies outside guest RAM.
    Memory { queue: usize, addr: u64, len: u32 },
    /// A TX chain shorter than the header or longer than a frame.
    Length { head: u16, len: u64 },
    /// The used ring could not be written.
    Used { queue: usize, detail: String },
    /// DRIVER_OK without VERSION_1: the legacy layout, which this device does not speak.
    Legacy,
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::BadQueue { queue } => write!(f, "queue {queue}'s rings are not in guest RAM or misaligned"),
            RingError::AvailIndex { queue, detail } => write!(f, "queue {queue}'s avail index: {detail}"),
            RingError::BadChain { queue, head } => write!(f, "queue {queue}: chain at descriptor {head} is empty, cut short or loops"),
            RingError::Direction { queue, head } => write!(f, "queue {queue}: chain at descriptor {head} has a buffer the wrong way"),
            RingError::Memory { queue, addr, len } => write!(f, "queue {queue}: buffer {addr:#x}+{len:#x} is not in guest RAM"),
            RingError::Length { head, len } => {
                write!(
                    f,
                    "TX chain at descriptor {head} is {len} bytes: not a {NET_HDR_LEN}-byte header and a frame of at most {MAX_FRAME}"
                )
            }
            RingError::Used { queue, detail } => write!(f, "queue {queue}'s used ring: {detail}"),
            RingError::Legacy => write!(f, "the driver did not accept VIRTIO_F_VERSION_1"),
        }
    }
}

/// Counters a test or a log line can read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetStats {
    pub tx_frames: u64,
    pub rx_frames: u64,
    /// Frames the host sent that did not fit the guest's buffer, or that the tap refused.
    pub dropped: u64,
    pub errors: u64,
}

pub struct VirtioNet<B> {
    mem: GuestMemoryMmap,
    backend: B,
    mac: [u8; 6],
    queues: [Queue; 2],
    queue_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    status: u32,
    interrupt_status: u32,
    interrupt: EventFd,
    /// A frame read from the host that waits for an RX buffer.
    pending: Option<usize>,
    rx_buf: Vec<u8>,
    pub stats: NetStats,
}

impl<B: NetBackend> VirtioNet<B> {
    /// `interrupt` is written to raise the device's interrupt (an irqfd in the VMM).
    pub fn new(mem: GuestMemoryMmap, backend: B, mac: [u8; 6], interrupt: EventFd) -> Self {
        let queue = || Queue::new(QUEUE_MAX).expect("QUEUE_MAX is a power of two");
        VirtioNet {
            mem,
            backend,
            mac,
            queues: [queue(), queue()],
            queue_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            interrupt_status: 0,
            interrupt,
            pending: None,
            rx_buf: vec![0; MAX_FRAME],
            stats: NetStats::default(),
        }
    }

    pub fn backend(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn status(&self) -> u32 {
        self.status
    }

    fn running(&self) -> bool {
        self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 && self.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0
    }

    fn reset(&mut self) {
        self.queues.iter_mut().for_each(QueueT::reset);
        self.queue_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt_status = 0;
    }

    /// Stops the device until the driver resets it, and tells the driver.
    fn fail(&mut self, error: RingError) {
        log::warn!("virtio-net: {error}; the device needs a reset");
        self.stats.errors += 1;
        self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        self.raise(VIRTIO_MMIO_INT_CONFIG);
    }

    fn raise(&mut self, why: u32) {
        self.interrupt_status |= why;
        if let Err(e) = self.interrupt.write(1) {
            log::warn!("virtio-net: raising the interrupt: {e}");
        }
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    pub fn read_register(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= VIRTIO_MMIO_CONFIG as u64 {
            // The configuration space: the MAC, read at any width.
            let start = (offset - VIRTIO_MMIO_CONFIG as u64) as usize;
            for (i, byte) in data.iter_mut().enumerate() {
                *byte = self.mac.get(start + i).copied().unwrap_or(0);
            }
            return;
        }
        if data.len() != 4 {
            return;
        }
        let queue = self.queues.get(self.queue_sel as usize);
        let value = match offset as u32 {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => 2,
            VIRTIO_MMIO_DEVICE_ID => VIRTIO_ID_NET,
            VIRTIO_MMIO_VENDOR_ID => VENDOR,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => FEATURES as u32,
                1 => (FEATURES >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => queue.map_or(0, |q| q.max_size() as u32),
            VIRTIO_MMIO_QUEUE_READY => queue.is_some_and(|q| q.ready()) as u32,
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status,
            VIRTIO_MMIO_STATUS => self.status,
            _ => 0,
        };
        data.copy_from_slice(&value.to_le_bytes());
    }

    pub fn write_register(&mut self, offset: u64, data: &[u8]) {
        // Registers are 32-bit; the configuration space is read-only.
        let Ok(bytes) = <[u8; 4]>::try_from(data) else { return };
        let value = u32::from_le_bytes(bytes);
        match offset as u32 {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => match self.driver_features_sel {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | (value as u64 & FEATURES),
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | ((value as u64) << 32 & FEATURES),
                _ => {}
            },
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM => {
                if let Some(q) = self.selected() {
                    q.set_size(value as u16);
                }
            }
            VIRTIO_MMIO_QUEUE_READY => self.set_queue_ready(value == 1),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(value as usize),
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt_status &= !value,
            VIRTIO_MMIO_STATUS => self.set_status(value),
            reg @ (VIRTIO_MMIO_QUEUE_DESC_LOW..=VIRTIO_MMIO_QUEUE_USED_HIGH) => {
                if let Some(q) = self.selected() {
                    let (low, high) = if reg % 8 == 0 { (Some(value), None) } else { (None, Some(value)) };
                    match reg & !7 {
                        VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(low, high),
                        VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(low, high),
                        VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(low, high),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn set_queue_ready(&mut self, ready: bool) {
        let index = self.queue_sel as usize;
        let mem = self.mem.clone();
        let Some(q) = self.queues.get_mut(index) else { return };
        // virtio-queue checks the rings of a ready queue only.
        q.set_ready(ready);
        if ready && !q.is_valid(&mem) {
            q.set_ready(false);
            self.fail(RingError::BadQueue { queue: index });
        }
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            return self.reset();
        }
        self.status = value;
        if value & VIRTIO_CONFIG_S_DRIVER_OK != 0 && self.driver_features & (1 << VIRTIO_F_VERSION_1) == 0 {
            self.fail(RingError::Legacy);
        }
    }

    /// The guest's doorbell for queue `index`.
    pub fn notify(&mut self, index: usize) {
        match index {
            TX => self.run(Self::transmit),
            RX => self.run(Self::deliver),
            _ => {}
        }
    }

    /// Takes waiting frames from the host into RX buffers (the poll thread, when the tap is
    /// readable). Before the driver starts the device (or while it needs a reset) the frames
    /// are dropped, as a link that is down drops them: left in the tap they would keep it
    /// readable and the poll thread spinning through a whole guest boot.
    pub fn host_ready(&mut self) {
        if self.running() {
            return self.run(Self::deliver);
        }
        while let Ok(Some(_)) = self.backend.recv(&mut self.rx_buf) {
            self.stats.dropped += 1;
        }
    }

    fn run(&mut self, step: fn(&mut Self) -> Result<bool, RingError>) {
        if !self.running() {
            return;
        }
        match step(self) {
            Ok(true) => self.raise(VIRTIO_MMIO_INT_VRING),
            Ok(false) => {}
            Err(e) => self.fail(e),
        }
    }

    /// Sends every frame the guest queued; whether the guest wants an interrupt for them.
    fn transmit(&mut self) -> Result<bool, RingError> {
        let mut frame = Vec::with_capacity(NET_HDR_LEN + MAX_FRAME);
        let mut sent = false;
        while let Some((head, descs)) = self.pop(TX)? {
            frame.clear();
            let total: u64 = descs.iter().map(|d| d.len() as u64).sum();
            if !(NET_HDR_LEN as u64..=(NET_HDR_LEN + MAX_FRAME) as u64).contains(&total) {
                return Err(RingError::Length { head, len: total });
            }
            for d in &descs {
                if d.is_write_only() {
                    return Err(RingError::Direction { queue: TX, head });
                }
                let start = frame.len();
                frame.resize(start + d.len() as usize, 0);
                self.mem.read_slice(&mut frame[start..], d.addr()).map_err(|_| RingError::Memory {
                    queue: TX,
                    addr: d.addr().0,
                    len: d.len(),
                })?;
            }
            match self.backend.send(&frame[NET_HDR_LEN..]) {
                Ok(()) => self.stats.tx_frames += 1,
                Err(e) => {
                    log::debug!("virtio-net: the host refused a frame: {e}");
                    self.stats.dropped += 1;
                }
            }
            self.used(TX, head, 0)?;
            sent = true;
        }
        self.wants_interrupt(TX, sent)
    }

    /// Moves host frames into the guest's RX buffers while both last.
    fn deliver(&mut self) -> Result<bool, RingError> {
        let mut delivered = false;
        loop {
            let len = match self.pending.take() {
                Some(len) => len,
                None => match self.backend.recv(&mut self.rx_buf) {
                    Ok(Some(len)) => len,
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("virtio-net: reading the host side: {e}");
                        break;
                    }
                },
            };
            let Some((head, descs)) = self.pop(RX)? else {
                self.pending = Some(len);
                break;
            };
            let room: u64 = descs.iter().map(|d| d.len() as u64).sum();
            if descs.iter().any(|d| !d.is_write_only()) {
                return Err(RingError::Direction { queue: RX, head });
            }
            if room < (NET_HDR_LEN + len) as u64 {
                // The driver's buffers are its own choice; a frame that does not fit is dropped
                // and the buffer given back empty.
                self.stats.dropped += 1;
                self.used(RX, head, 0)?;
                delivered = true;
                continue;
            }
            let mut header = [0u8; NET_HDR_LEN];
            // num_buffers: one, since mergeable RX buffers are not offered.
            header[10] = 1;
            let mut source = header.iter().chain(&self.rx_buf[..len]).copied();
            for d in &descs {
                let chunk: Vec<u8> = source.by_ref().take(d.len() as usize).collect();
                if chunk.is_empty() {
                    break;
                }
                self.mem.write_slice(&chunk, d.addr()).map_err(|_| RingError::Memory { queue: RX, addr: d.addr().0, len: d.len() })?;
            }
            self.used(RX, head, (NET_HDR_LEN + len) as u32)?;
            self.stats.rx_frames += 1;
            delivered = true;
        }
        self.wants_interrupt(RX, delivered)
    }

    /// The next chain of queue `index`, walked in full, or None when the ring is empty.
    fn pop(&mut self, index: usize) -> Result<Option<(u16, Vec<Descriptor>)>, RingError> {
        let queue = &mut self.queues[index];
        if !queue.ready() {
            return Ok(None);
        }
        let mut avail = queue.iter(&self.mem).map_err(|e| RingError::AvailIndex { queue: index, detail: e.to_string() })?;
        let Some(chain): Option<DescriptorChain<&GuestMemoryMmap>> = avail.next() else { return Ok(None) };
        let head = chain.head_index();
        // The iterator ends quietly on a bad next index, a loop (its TTL) or a bad indirect
        // table, so a chain whose last descriptor still says NEXT was cut short.
        let descs: Vec<Descriptor> = chain.collect();
        match descs.last() {
            Some(last) if !last.has_next() => Ok(Some((head, descs))),
            _ => Err(RingError::BadChain { queue: index, head }),
        }
    }

    fn used(&mut self, index: usize, head: u16, len: u32) -> Result<(), RingError> {
        self.queues[index].add_used(&self.mem, head, len).map_err(|e| RingError::Used { queue: index, detail: e.to_string() })
    }

    fn wants_interrupt(&mut self, index: usize, progressed: bool) -> Result<bool, RingError> {
        if !progressed {
            return Ok(false);
        }
        self.queues[index].needs_notification(&self.mem).map_err(|e| RingError::Used { queue: index, detail: e.to_string() })
    }
}

/// Builds the device over a new tap, its irqfd on IOAPIC pin `irq`, the kernel command-line word
/// that tells Linux where it is, and the thread that moves host frames in.
pub fn create(name: &str, base: u64, irq: u32, tap: &str, host: Option<(Ipv4Addr, u8)>, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    let tap = Tap::open(tap, host).map_err(|e| VmError::Config(format!("device.{name}.tap: {e}")))?;
    let poll_fd = tap.as_fd().try_clone_to_owned().map_err(|e| VmError::Config(format!("device.{name}.tap: {e}")))?;
    let interrupt = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmError::Kvm(format!("virtio-net interrupt eventfd: {e}")))?;
    env.vm.register_irqfd(&interrupt, irq).map_err(|e| VmError::Kvm(format!("virtio-net irqfd on GSI {irq}: {e}")))?;
    let device = Arc::new(Mutex::new(VirtioNet::new(env.memory.guest_memory().clone(), tap, GUEST_MAC, interrupt)));
    let handle: crate::hooks::DeviceHandle = device.clone();
    env.registry.hook(name, HookKey::Mmio { base, len: MMIO_SIZE }, handle).map_err(|e| VmError::Config(format!("device.{name}: {e}")))?;
    env.cmdline_extra.push(format!("virtio_mmio.device={MMIO_SIZE:#x}@{base:#x}:{irq}"));
    std::thread::Builder::new()
        .name(format!("{name}-rx"))
        .spawn(move || loop {
            let mut fd = libc::pollfd { fd: poll_fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; the descriptor is owned by this thread.
            if unsafe { libc::poll(&mut fd, 1, 1000) } > 0 {
                let waiting = {
                    let mut net = device.lock().unwrap_or_else(|e| e.into_inner());
                    net.host_ready();
                    net.pending.is_some()
                };
                if waiting {
                    // The guest has no RX buffer free: wait for it rather than spin on the tap.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
        .map_err(|e| VmError::Config(format!("device.{name}: starting its thread: {e}")))?;
    Ok(())
}

/// A locally administered address; each VM has a tap of its own, so one address serves all.
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xc1, 0x00, 0x01];

impl<B: NetBackend> Device for VirtioNet<B> {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::MmioRead { offset, data } => self.read_register(offset, data),
            Request::MmioWrite { offset, data } => self.write_register(offset, data),
            other => return Err(DeviceError(format!("virtio-net cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}
