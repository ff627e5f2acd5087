//! The mailbox driven as the guest library drives it, against a recording host.

use std::sync::{Arc, Mutex};

use xemem::pci;

use super::mailbox::{MailboxHost, MailboxRequest, Op, XememPci, MAGIC, MAX_RUNS};
use super::*;

const MAILBOX_BASE: u64 = 0xc000_0000;
const APERTURE: u64 = 0xc000_0000;
const WINDOW_BASE: u64 = 64 << 30;
const KNOWN_APID: u64 = 9;
const OTHER_APID: u64 = 10;

#[derive(Default)]
struct Seen {
    calls: Vec<MailboxRequest>,
    placed: Vec<(u64, u64, u64, u64, u32)>,
    unplaced: Vec<u32>,
    /// What `unplace` answers: the host keeps a detached attachment's memory.
    keeps: bool,
}

struct FakeHost(Arc<Mutex<Seen>>);

impl MailboxHost for FakeHost {
    fn call(&mut self, request: &MailboxRequest) -> Result<[u64; 4], i32> {
        let mut seen = self.0.lock().unwrap();
        seen.calls.push(MailboxRequest { op: request.op, args: request.args, name: request.name.clone(), runs: request.runs.clone() });
        Ok([seen.calls.len() as u64, 0, 0, 0])
    }

    fn place(&mut self, apid: u64, offset: u64, len: u64, gpa: u64) -> Result<u32, i32> {
        if apid != KNOWN_APID && apid != OTHER_APID {
            return Err(libc::ENOENT);
        }
        let mut seen = self.0.lock().unwrap();
        let slot = 100 + seen.placed.len() as u32;
        seen.placed.push((apid, offset, len, gpa, slot));
        Ok(slot)
    }

    fn unplace(&mut self, slot: u32) -> bool {
        let mut seen = self.0.lock().unwrap();
        seen.unplaced.push(slot);
        seen.keeps
    }
}

fn device() -> (XememPci, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let bus = PciBus::new(MAILBOX_BASE as u32, WINDOW_BASE, WINDOW_SIZE);
    (XememPci::new(bus, APERTURE, Box::new(FakeHost(seen.clone()))), seen)
}

fn put(device: &mut XememPci, offset: u64, bytes: &[u8]) {
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let at = MAILBOX_BASE + offset + 8 * i as u64;
        if chunk.len() == 8 {
            device.mmio_write(at, chunk);
        } else {
            for (j, byte) in chunk.iter().enumerate() {
                device.mmio_write(at + j as u64, &[*byte]);
            }
        }
    }
}

fn get_u64(device: &XememPci, offset: u64) -> u64 {
    let mut data = [0u8; 8];
    device.mmio_read(MAILBOX_BASE + offset, &mut data);
    u64::from_le_bytes(data)
}

fn get_u32(device: &XememPci, offset: u64) -> u32 {
    let mut data = [0u8; 4];
    device.mmio_read(MAILBOX_BASE + offset, &mut data);
    u32::from_le_bytes(data)
}

/// One request: op, args, then the doorbell; the errno and results.
fn ask(device: &mut XememPci, op: u32, args: &[u64]) -> (i32, [u64; 4]) {
    put(device, pci::OP, &op.to_le_bytes());
    for (i, arg) in args.iter().enumerate() {
        put(device, pci::ARGS + 8 * i as u64, &arg.to_le_bytes());
    }
    let seq = get_u32(device, pci::DONE) + 1;
    device.mmio_write(MAILBOX_BASE + pci::DOORBELL, &seq.to_le_bytes());
    assert_eq!(get_u32(device, pci::DONE), seq, "answered before the write returns");
    (get_u32(device, pci::ERROR) as i32, std::array::from_fn(|i| get_u64(device, pci::RESULTS + 8 * i as u64)))
}

#[test]
fn the_host_fields_read_back_and_are_not_writable() {
    let (mut device, _) = device();
    assert_eq!(get_u32(&device, pci::MAGIC_AT), MAGIC);
    assert_eq!(get_u32(&device, pci::VERSION_AT), pci::VERSION);
    put(&mut device, pci::MAGIC_AT, &[0; 8]);
    put(&mut device, pci::DONE, &[7, 0, 0, 0]);
    put(&mut device, pci::RESULTS, &[7; 32]);
    assert_eq!(get_u32(&device, pci::MAGIC_AT), MAGIC);
    assert_eq!(get_u32(&device, pci::DONE), 0);
    assert_eq!(get_u64(&device, pci::RESULTS), 0);
    // Misaligned, odd-sized and out-of-BAR accesses read all ones and write nothing.
    let mut data = [0u8; 4];
    device.mmio_read(MAILBOX_BASE + 2, &mut data);
    assert_eq!(data, [0xff; 4]);
    let mut odd = [0u8; 3];
    device.mmio_read(MAILBOX_BASE, &mut odd);
    assert_eq!(odd, [0xff; 3]);
    device.mmio_read(MAILBOX_BASE + MAILBOX_SIZE, &mut data);
    assert_eq!(data, [0xff; 4]);
    device.mmio_read(MAILBOX_BASE - 4, &mut data);
    assert_eq!(data, [0xff; 4]);
    device.mmio_write(MAILBOX_BASE + pci::OP + 2, &[1, 2, 3, 4]);
    assert_eq!(get_u32(&device, pci::OP), 0);
}

#[test]
fn requests_reach_the_host_checked() {
    let (mut device, seen) = device();
    assert_eq!(ask(&mut device, Op::Hello as u32, &[]).0, 0);
    assert_eq!(ask(&mut device, 0, &[]).0, libc::ENOSYS);
    assert_eq!(ask(&mut device, 11, &[]).0, libc::ENOSYS);
    // RUNS: page-aligned, non-empty, within the count the mailbox holds.
    put(&mut device, pci::NRUNS, &2u32.to_le_bytes());
    put(
        &mut device,
        pci::RUNS,
        &[0x1000u64.to_le_bytes(), 0x2000u64.to_le_bytes(), 0x8000u64.to_le_bytes(), 0x1000u64.to_le_bytes()].concat(),
    );
    assert_eq!(ask(&mut device, Op::Runs as u32, &[0]).0, 0);
    put(&mut device, pci::RUNS + 8, &0x1001u64.to_le_bytes());
    assert_eq!(ask(&mut device, Op::Runs as u32, &[0]).0, libc::EINVAL, "unaligned length");
    put(&mut device, pci::RUNS + 8, &0u64.to_le_bytes());
    assert_eq!(ask(&mut device, Op::Runs as u32, &[0]).0, libc::EINVAL, "empty run");
    put(&mut device, pci::RUNS, &(u64::MAX - 0xfff).to_le_bytes());
    put(&mut device, pci::RUNS + 8, &0x2000u64.to_le_bytes());
    assert_eq!(ask(&mut device, Op::Runs as u32, &[0]).0, libc::EINVAL, "wrapping run");
    put(&mut device, pci::NRUNS, &(MAX_RUNS as u32 + 1).to_le_bytes());
    assert_eq!(ask(&mut device, Op::Runs as u32, &[0]).0, libc::EINVAL, "too many runs");
    put(&mut device, pci::NRUNS, &0u32.to_le_bytes());
    assert_eq!(ask(&mut device, Op::Runs as u32, &[0]).0, libc::EINVAL, "no runs");
    // Names: NUL-terminated, printable, no spaces; MAKE may have none, LOOKUP must.
    put(&mut device, pci::NAME, &[0; 64]);
    assert_eq!(ask(&mut device, Op::Make as u32, &[0, 0x3000, 1, 0o600, 2]).0, 0);
    assert_eq!(ask(&mut device, Op::Lookup as u32, &[]).0, libc::EINVAL);
    put(&mut device, pci::NAME, b"a name\0");
    assert_eq!(ask(&mut device, Op::Lookup as u32, &[]).0, libc::EINVAL);
    put(&mut device, pci::NAME, &[b'x'; 64]);
    assert_eq!(ask(&mut device, Op::Lookup as u32, &[]).0, libc::EINVAL, "no NUL");
    put(&mut device, pci::NAME, b"seg-1\0");
    let (error, results) = ask(&mut device, Op::Lookup as u32, &[]);
    assert_eq!((error, results[0]), (0, 4));
    let seen = seen.lock().unwrap();
    let ops: Vec<Op> = seen.calls.iter().map(|c| c.op).collect();
    assert_eq!(ops, [Op::Hello, Op::Runs, Op::Make, Op::Lookup]);
    assert_eq!(seen.calls[1].runs, [(0x1000, 0x2000), (0x8000, 0x1000)]);
    assert_eq!(seen.calls[2].name, None);
    assert_eq!(seen.calls[2].args[..5], [0, 0x3000, 1, 0o600, 2]);
    assert_eq!(seen.calls[3].name.as_deref(), Some("seg-1"));
}

#[test]
fn attach_places_one_slot_and_detach_removes_it() {
    let (mut device, seen) = device();
    let (error, results) = ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0x4000, 3 << 20]);
    assert_eq!(error, 0);
    assert_eq!(results[..2], [0, 3 << 20]);
    let (error, second) = ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0, 0x1000]);
    assert_eq!((error, second[0]), (0, 4 << 20), "2 MiB-aligned after the first");
    assert_eq!(
        seen.lock().unwrap().placed,
        [(KNOWN_APID, 0x4000, 3 << 20, WINDOW_BASE, 100), (KNOWN_APID, 0, 0x1000, WINDOW_BASE + (4 << 20), 101)]
    );
    // Refused by the host: nothing stays placed.
    assert_eq!(ask(&mut device, Op::Attach as u32, &[5, 0, 0x1000]).0, libc::ENOENT);
    assert_eq!(ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0x10, 0x1000]).0, libc::EINVAL);
    assert_eq!(ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0, 0]).0, libc::EINVAL);
    assert_eq!(ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0, WINDOW_SIZE]).0, libc::ENOSPC);
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, 0);
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, libc::EINVAL, "twice");
    assert_eq!(ask(&mut device, Op::Detach as u32, &[12345]).0, libc::EINVAL);
    assert_eq!(seen.lock().unwrap().unplaced, [100]);
    // The window's hole is reused.
    assert_eq!(ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0, 0x1000]).1[0], 0);
}

#[test]
fn a_kept_placement_is_parked_for_the_same_range_and_given_back_at_release() {
    let (mut device, seen) = device();
    seen.lock().unwrap().keeps = true;
    let attach = |device: &mut XememPci, offset: u64, len: u64| ask(device, Op::Attach as u32, &[KNOWN_APID, offset, len]);
    assert_eq!(attach(&mut device, 0, 4 << 20), (0, [0, 4 << 20, 0, 0]));
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, 0);
    // Parked: another permit's attach goes elsewhere, the same range through the permit there.
    seen.lock().unwrap().keeps = false;
    assert_eq!(ask(&mut device, Op::Attach as u32, &[OTHER_APID, 0, 0x1000]), (0, [4 << 20, 0x1000, 0, 0]));
    assert_eq!(ask(&mut device, Op::Detach as u32, &[4 << 20]).0, 0);
    assert_eq!(attach(&mut device, 0, 4 << 20).1[0], 0, "the same range at its parked place");
    // ... as the host was asked: at the parked address, not a new one.
    let addresses: Vec<u64> = seen.lock().unwrap().placed.iter().map(|p| p.3).collect();
    assert_eq!(addresses, [WINDOW_BASE, WINDOW_BASE + (4 << 20), WINDOW_BASE]);
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, 0);
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, libc::EINVAL, "detached once only");
    assert_eq!(attach(&mut device, 0, 0x1000).1[0], 0, "not kept by the host: the place was given back");
    seen.lock().unwrap().keeps = true;
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, 0);
    // Another range through the permit: placed beside the parked one, which then goes.
    assert_eq!(attach(&mut device, 0x1000, 0x1000).1[0], 2 << 20);
    assert_eq!(ask(&mut device, Op::Detach as u32, &[2 << 20]).0, 0);
    assert_eq!(ask(&mut device, Op::Attach as u32, &[5, 0, 0x1000]).0, libc::ENOENT);
    assert_eq!(attach(&mut device, 0, 0x1000).1[0], 0, "the lowest free place");
    assert_eq!(ask(&mut device, Op::Detach as u32, &[0]).0, 0);
    // Released: the parked place is free again.
    assert_eq!(ask(&mut device, Op::Release as u32, &[KNOWN_APID]).0, 0);
    assert_eq!(attach(&mut device, 0x2000, 0x1000).1[0], 0);
    assert_eq!(attach(&mut device, 0x3000, 0x1000).1[0], 2 << 20, "the stale place was given back");
}

#[test]
fn the_mailbox_follows_its_bar_and_the_config_ports_work_through_the_device() {
    let (mut device, _) = device();
    let ctx = ExitContext { vcpu: 0, vcpu_fd: None };
    let mut data = [0u8; 4];
    device.handle(&ctx, Request::MmioRead { offset: 0, data: &mut data }).unwrap();
    assert_eq!(u32::from_le_bytes(data), MAGIC);
    // Move BAR0 up by 64 KiB through the configuration ports.
    let select = (ENABLE | u32::from(XEMEM_SLOT) << 11 | 0x10).to_le_bytes();
    device.handle(&ctx, Request::PortWrite { offset: 0, data: &select }).unwrap();
    device.handle(&ctx, Request::PortWrite { offset: 4, data: &(MAILBOX_BASE as u32 + 0x1_0000).to_le_bytes() }).unwrap();
    device.handle(&ctx, Request::MmioRead { offset: 0, data: &mut data }).unwrap();
    assert_eq!(data, [0xff; 4], "nothing at the old place");
    device.handle(&ctx, Request::MmioRead { offset: 0x1_0000, data: &mut data }).unwrap();
    assert_eq!(u32::from_le_bytes(data), MAGIC);
    let mut value = 0;
    assert!(device.handle(&ctx, Request::MsrRead { index: 1, value: &mut value }).is_err());
}

#[test]
fn the_device_shares_its_attached_placements_with_the_holes() {
    use super::touch::Touch;
    let (mut device, _) = device();
    let touches = device.touches();
    let mut holes = super::mailbox::WindowHoles::new(WINDOW_BASE, touches.clone());
    let (_, results) = ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0, 0x3000]);
    let (_, second) = ask(&mut device, Op::Attach as u32, &[KNOWN_APID, 0, 0x1000]);
    // No vCPU behind this context: its privilege level is unknown and nothing is reported.
    let mut data = [0u8; 8];
    holes.handle(&ExitContext { vcpu: 0, vcpu_fd: None }, Request::MmioRead { offset: second[0], data: &mut data }).unwrap();
    assert_eq!((data, holes.accesses, holes.reported), ([0xff; 8], 1, 0));
    let now = std::time::Instant::now();
    assert!(touches.touched(WINDOW_BASE + second[0] + 0xff8, || Some(3), now), "a user-mode touch of the second");
    assert_eq!(touches.wait(), [Touch { token: 101, window_offset: second[0] }]);
    assert_eq!(ask(&mut device, Op::Detach as u32, &[results[0]]).0, 0);
    assert!(!touches.touched(WINDOW_BASE + 0x1000, || Some(3), now), "the first, detached");
}

#[test]
fn window_holes_read_all_ones_and_count() {
    use super::mailbox::WindowHoles;
    let mut holes = WindowHoles::new(WINDOW_BASE, Default::default());
    let ctx = ExitContext { vcpu: 0, vcpu_fd: None };
    let mut data = [0u8; 8];
    holes.handle(&ctx, Request::MmioRead { offset: 0x20_0000, data: &mut data }).unwrap();
    assert_eq!(data, [0xff; 8]);
    holes.handle(&ctx, Request::MmioWrite { offset: 0, data: &[1, 2] }).unwrap();
    assert_eq!(holes.accesses, 2);
    assert!(holes.handle(&ctx, Request::PortRead { offset: 0, data: &mut data }).is_err());
}
