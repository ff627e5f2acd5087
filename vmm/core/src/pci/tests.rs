//! The configuration space and the window, driven through the two ports as a guest would.

use super::window::{Window, WindowError, PLACEMENT_ALIGN};
use super::*;

const MAILBOX_BASE: u32 = 0xc000_0000;
const WINDOW_BASE: u64 = 64 << 30;

fn bus() -> PciBus {
    PciBus::new(MAILBOX_BASE, WINDOW_BASE, WINDOW_SIZE)
}

fn select(bus: &mut PciBus, slot: u8, register: u8) {
    let address = ENABLE | u32::from(slot) << 11 | u32::from(register);
    bus.port_write(0, &address.to_le_bytes()).unwrap();
}

fn read(bus: &mut PciBus, slot: u8, register: u8) -> u32 {
    select(bus, slot, register);
    let mut data = [0u8; 4];
    bus.port_read(4, &mut data);
    u32::from_le_bytes(data)
}

fn write(bus: &mut PciBus, slot: u8, register: u8, value: u32) -> Result<(), ConfigError> {
    select(bus, slot, register);
    bus.port_write(4, &value.to_le_bytes())
}

#[test]
fn identity_registers_of_both_functions() {
    let mut bus = bus();
    assert_eq!(read(&mut bus, 0, 0), u32::from(HOST_BRIDGE) << 16 | u32::from(VENDOR));
    assert_eq!(read(&mut bus, 0, 8) >> 8, CLASS_HOST_BRIDGE);
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0), u32::from(XEMEM_DEVICE) << 16 | u32::from(VENDOR));
    assert_eq!(read(&mut bus, XEMEM_SLOT, 8), CLASS_MEMORY_OTHER << 8 | 1);
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x2c), read(&mut bus, XEMEM_SLOT, 0));
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x3c), 0xff, "interrupt line unset, pin 0");
    // Every other register of the header and beyond reads as zero and ignores writes.
    for register in (0x0c..=0xfc).step_by(4).filter(|r| !(0x10..=0x24).contains(r) && ![0x2c, 0x3c].contains(r)) {
        write(&mut bus, XEMEM_SLOT, register, u32::MAX).unwrap();
        assert_eq!(read(&mut bus, XEMEM_SLOT, register), 0, "register {register:#x}");
    }
}

#[test]
fn absent_functions_and_disabled_addresses_read_all_ones() {
    let mut bus = bus();
    assert_eq!(read(&mut bus, 2, 0), u32::MAX);
    let other_bus = ENABLE | 1 << 16;
    bus.port_write(0, &other_bus.to_le_bytes()).unwrap();
    let mut data = [0u8; 4];
    bus.port_read(4, &mut data);
    assert_eq!(u32::from_le_bytes(data), u32::MAX);
    let function_one = ENABLE | u32::from(XEMEM_SLOT) << 11 | 1 << 8;
    bus.port_write(0, &function_one.to_le_bytes()).unwrap();
    bus.port_read(4, &mut data);
    assert_eq!(u32::from_le_bytes(data), u32::MAX);
    bus.port_write(0, &0u32.to_le_bytes()).unwrap();
    bus.port_read(4, &mut data);
    assert_eq!(u32::from_le_bytes(data), u32::MAX, "enable bit clear");
    // Writes to absent functions change nothing anywhere.
    bus.port_write(4, &0u32.to_le_bytes()).unwrap();
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0) & 0xffff, u32::from(VENDOR));
}

#[test]
fn the_address_register_reads_back_and_partial_accesses() {
    let mut bus = bus();
    select(&mut bus, XEMEM_SLOT, 0);
    let mut data = [0u8; 4];
    bus.port_read(0, &mut data);
    assert_eq!(u32::from_le_bytes(data), ENABLE | u32::from(XEMEM_SLOT) << 11);
    // Byte and word reads at their offsets within the data dword.
    let mut word = [0u8; 2];
    bus.port_read(6, &mut word);
    assert_eq!(u16::from_le_bytes(word), XEMEM_DEVICE);
    let mut byte = [0u8; 1];
    bus.port_read(5, &mut byte);
    assert_eq!(byte[0], (VENDOR >> 8) as u8);
}

#[test]
fn unaligned_and_odd_accesses_read_all_ones_and_are_ignored() {
    let mut bus = bus();
    select(&mut bus, XEMEM_SLOT, 0x04);
    for (offset, len) in [(5u16, 2usize), (5, 4), (6, 4), (7, 2), (4, 3), (1, 4), (0, 2)] {
        let mut data = vec![0u8; len];
        bus.port_read(offset, &mut data);
        assert!(data.iter().all(|&b| b == 0xff), "read at {offset} of {len}");
        bus.port_write(offset, &vec![0xff; len]).unwrap();
    }
    // The misaligned writes above touched neither the command register nor the address.
    let mut data = [0u8; 4];
    bus.port_read(0, &mut data);
    assert_eq!(u32::from_le_bytes(data), ENABLE | u32::from(XEMEM_SLOT) << 11 | 4);
    assert_eq!(read(&mut bus, XEMEM_SLOT, 4), u32::from(config::COMMAND_MEMORY));
}

#[test]
fn command_register_keeps_only_its_writable_bits() {
    let mut bus = bus();
    write(&mut bus, XEMEM_SLOT, 4, u32::MAX).unwrap();
    assert_eq!(read(&mut bus, XEMEM_SLOT, 4), 0b111);
    // A byte write to the interrupt line leaves the pin alone.
    select(&mut bus, XEMEM_SLOT, 0x3c);
    bus.port_write(4, &[11]).unwrap();
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x3c), 11);
}

#[test]
fn bars_are_sized_by_writing_all_ones() {
    let mut bus = bus();
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x10), MAILBOX_BASE);
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x18), (WINDOW_BASE as u32) | 0b1100);
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x1c), (WINDOW_BASE >> 32) as u32);
    // Sizing, as Linux does it: decoding off, all ones, read, restore.
    write(&mut bus, XEMEM_SLOT, 4, 0).unwrap();
    write(&mut bus, XEMEM_SLOT, 0x10, u32::MAX).unwrap();
    assert_eq!(read(&mut bus, XEMEM_SLOT, 0x10), !(MAILBOX_SIZE as u32 - 1));
    write(&mut bus, XEMEM_SLOT, 0x18, u32::MAX).unwrap();
    write(&mut bus, XEMEM_SLOT, 0x1c, u32::MAX).unwrap();
    let low = read(&mut bus, XEMEM_SLOT, 0x18);
    let high = read(&mut bus, XEMEM_SLOT, 0x1c);
    assert_eq!(low & 0xf, 0b1100, "64-bit prefetchable");
    assert_eq!(!(u64::from(high) << 32 | u64::from(low & !0xf)) + 1, WINDOW_SIZE);
    // Unused BAR slots size to zero: not implemented.
    for register in [0x14, 0x20, 0x24] {
        write(&mut bus, XEMEM_SLOT, register, u32::MAX).unwrap();
        assert_eq!(read(&mut bus, XEMEM_SLOT, register), 0);
    }
    // Reprogramming keeps only the size-aligned bits.
    write(&mut bus, XEMEM_SLOT, 0x18, 0).unwrap();
    write(&mut bus, XEMEM_SLOT, 0x1c, 0x20 | 0x7).unwrap();
    write(&mut bus, XEMEM_SLOT, 4, config::COMMAND_MEMORY.into()).unwrap();
    assert_eq!(bus.window_base(), Some(0x20 << 32));
    write(&mut bus, XEMEM_SLOT, 0x10, 0xd000_1234).unwrap();
    assert_eq!(bus.mailbox_base(), Some(0xd000_0000));
}

#[test]
fn a_locked_window_bar_refuses_reprogramming_and_decoding_off() {
    let mut bus = bus();
    let (offset, gpa) = bus.place(3 << 20).unwrap();
    assert_eq!((offset, gpa), (0, WINDOW_BASE));
    bus.set_slot(offset, 7).unwrap();
    let before = (read(&mut bus, XEMEM_SLOT, 0x18), read(&mut bus, XEMEM_SLOT, 0x1c));
    // A 64 GiB BAR's low half has no address bits: all ones there moves nothing.
    write(&mut bus, XEMEM_SLOT, 0x18, u32::MAX).unwrap();
    assert!(matches!(write(&mut bus, XEMEM_SLOT, 0x1c, u32::MAX), Err(ConfigError::Locked(_))));
    assert!(matches!(write(&mut bus, XEMEM_SLOT, 0x1c, 0x1), Err(ConfigError::Locked(_))));
    assert!(matches!(write(&mut bus, XEMEM_SLOT, 4, 0), Err(ConfigError::Locked(_))));
    assert_eq!((read(&mut bus, XEMEM_SLOT, 0x18), read(&mut bus, XEMEM_SLOT, 0x1c)), before);
    assert_eq!(bus.window_base(), Some(WINDOW_BASE));
    // Writing the same base back, and moving the mailbox, are fine.
    write(&mut bus, XEMEM_SLOT, 0x18, before.0).unwrap();
    write(&mut bus, XEMEM_SLOT, 0x10, 0xd000_0000).unwrap();
    // After the detach the BAR may move again.
    assert_eq!(bus.unplace(offset), Ok(7));
    write(&mut bus, XEMEM_SLOT, 0x1c, 0x30).unwrap();
    assert_eq!(bus.window_base(), Some(0x30 << 32));
}

#[test]
fn placement_needs_decoding() {
    let mut bus = bus();
    write(&mut bus, XEMEM_SLOT, 4, 0).unwrap();
    assert_eq!(bus.place(4096), Err(PlaceError::NotDecoding));
}

#[test]
fn window_places_aligned_first_fit_and_refuses_what_does_not_fit() {
    let mut window: Window<u32> = Window::new(16 * PLACEMENT_ALIGN);
    assert_eq!(window.place(0, 0), Err(WindowError::BadLength(0)));
    assert_eq!(window.place(17 * PLACEMENT_ALIGN, 0), Err(WindowError::BadLength(17 * PLACEMENT_ALIGN)));
    assert_eq!(window.place(u64::MAX, 0), Err(WindowError::BadLength(u64::MAX)));
    assert_eq!(window.place(1, 1), Ok(0));
    assert_eq!(window.place(PLACEMENT_ALIGN + 1, 2), Ok(PLACEMENT_ALIGN));
    assert_eq!(window.place(PLACEMENT_ALIGN, 3), Ok(3 * PLACEMENT_ALIGN));
    assert_eq!(window.remove(PLACEMENT_ALIGN), Ok((2 * PLACEMENT_ALIGN, 2)));
    // The hole left behind is reused, lowest first.
    assert_eq!(window.place(PLACEMENT_ALIGN, 4), Ok(PLACEMENT_ALIGN));
    assert_eq!(window.place(2 * PLACEMENT_ALIGN, 5), Ok(4 * PLACEMENT_ALIGN));
    assert_eq!(window.place(10 * PLACEMENT_ALIGN, 6), Ok(6 * PLACEMENT_ALIGN));
    assert_eq!(window.place(1, 7), Ok(2 * PLACEMENT_ALIGN));
    assert_eq!(window.place(1, 8), Err(WindowError::Full(1)));
    assert_eq!(window.remove(12345), Err(WindowError::NotPlaced(12345)));
    assert_eq!(
        window.placements().map(|(o, _, t)| (o / PLACEMENT_ALIGN, *t)).collect::<Vec<_>>(),
        [(0, 1), (1, 4), (2, 7), (3, 3), (4, 5), (6, 6)]
    );
}

#[test]
fn device_hook_refuses_other_requests_and_counts_refusals() {
    let mut bus = bus();
    bus.place(1).unwrap();
    let ctx = ExitContext { vcpu: 0, vcpu_fd: None };
    let address = (ENABLE | u32::from(XEMEM_SLOT) << 11 | 0x1c).to_le_bytes();
    bus.handle(&ctx, Request::PortWrite { offset: 0, data: &address }).unwrap();
    bus.handle(&ctx, Request::PortWrite { offset: 4, data: &[0, 0, 0, 0] }).unwrap();
    assert_eq!(bus.refused, 1);
    let mut value = 0;
    assert!(bus.handle(&ctx, Request::MsrRead { index: 0, value: &mut value }).is_err());
}
