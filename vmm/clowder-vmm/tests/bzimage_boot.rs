//! The Linux boot protocol under /dev/kvm: the test guest wrapped into a bzImage (see
//! `support/bzimage.rs`) boots through clowder-vmm's zero page with an initrd, and its
//! `test=zeropage` prints what it found (kernels/testguest/README.md); that must be the VMM's
//! layout. bzImages the VMM cannot start 64-bit are refused as configuration errors.

#[macro_use]
mod support;

use std::path::PathBuf;

use support::{bzimage, run_with_args, testguest, Launch, Scratch, CHANNEL_SIZE, GUEST_MEMORY_BYTES};
use vmm::arch::layout::{CMDLINE_ADDR, PAGE_SIZE, ZERO_PAGE_ADDR};
use vmm::arch::memmap::GuestLayout;

/// `type_of_loader` for "undefined boot loader", which the VMM announces itself as.
const LOADER_UNDEFINED: u64 = 0xff;
/// `loadflags` the VMM must set: LOADED_HIGH and CAN_USE_HEAP.
const LOADED_HIGH_CAN_USE_HEAP: u64 = 0x81;

fn write_bzimage(scratch: &Scratch, version: u16, xloadflags: u16) -> PathBuf {
    let elf = std::fs::read(testguest()).unwrap();
    let path = scratch.path().join("testguest.bzImage");
    std::fs::write(&path, bzimage::from_elf(&elf, version, xloadflags)).unwrap();
    path
}

/// The hex number after `key` in `line` (`key=0x..` or `key 0x..`).
fn hex_after(line: &str, key: &str) -> u64 {
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("no {key:?} in {line:?}")) + key.len()..];
    let digits = rest.trim_start_matches([' ', '=']).trim_start_matches("0x");
    let end = digits.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(digits.len());
    u64::from_str_radix(&digits[..end], 16).unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
}

fn line_starting<'a>(serial: &'a str, prefix: &str) -> &'a str {
    serial.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{serial}"))
}

#[test]
fn bzimage_boots_with_zero_page_e820_cmdline_and_initrd() {
    require_kvm!();
    let scratch = Scratch::new("bzimage");
    let kernel = write_bzimage(&scratch, bzimage::PROTOCOL_2_15, bzimage::XLF_KERNEL_64);
    let initrd_path = scratch.path().join("initrd.img");
    let initrd: Vec<u8> = b"INITRD01".iter().copied().chain((0..9000u32).map(|i| (i * 7) as u8)).collect();
    std::fs::write(&initrd_path, &initrd).unwrap();

    let ended =
        Launch::kernel(&kernel, "test=zeropage marker=linux-boot").arg("--module", initrd_path.display().to_string()).start().wait();
    assert_eq!(ended.code(), 0, "{ended}");
    let serial = &ended.serial;
    assert!(serial.starts_with("testguest: test=zeropage vcpu=0 boot=linux\n"), "entered at the 64-bit entry\n{ended}");

    // The zero page is where the ABI says, with the kernel's own header and the loader's fields.
    let header = line_starting(serial, "zeropage: at ");
    assert_eq!(hex_after(header, "at"), ZERO_PAGE_ADDR, "RSI pointed at the zero page");
    assert_eq!(hex_after(header, "header"), 0x5372_6448, "HdrS");
    assert_eq!(hex_after(header, "version"), u64::from(bzimage::PROTOCOL_2_15), "the image's own header is kept");
    assert_eq!(hex_after(header, "xloadflags"), u64::from(bzimage::XLF_KERNEL_64));
    assert_eq!(hex_after(header, "loader"), LOADER_UNDEFINED, "type_of_loader");
    assert_eq!(hex_after(header, "loadflags") & LOADED_HIGH_CAN_USE_HEAP, LOADED_HIGH_CAN_USE_HEAP, "{header}");

    // The command line: ours, then the VMM's keys, at cmd_line_ptr.
    let layout = GuestLayout::new(GUEST_MEMORY_BYTES, CHANNEL_SIZE).unwrap();
    let cmdline_line = line_starting(serial, "zeropage: cmdline at ");
    assert_eq!(hex_after(cmdline_line, "at"), CMDLINE_ADDR);
    let cmdline = cmdline_line.split_once(" '").unwrap().1.trim_end_matches('\'');
    let channel = layout.channel.expect("the default channel device");
    assert!(cmdline.starts_with("test=zeropage marker=linux-boot clowder."), "{cmdline}");
    assert!(cmdline.contains(&format!("clowder.channel={:#x},{:#x}", channel.gpa, channel.size)), "{cmdline}");
    assert!(cmdline.contains("clowder.cpus=1"), "{cmdline}");

    // The initrd: page aligned, as high as it goes below the channel, its bytes in place.
    let initrd_line = line_starting(serial, "zeropage: initrd ");
    let expected_address = (layout.low_usable_end() - initrd.len() as u64) & !(PAGE_SIZE - 1);
    assert_eq!(hex_after(initrd_line, "addr"), expected_address, "{initrd_line}");
    assert_eq!(hex_after(initrd_line, "size"), initrd.len() as u64);
    assert_eq!(hex_after(initrd_line, "head"), u64::from_le_bytes(*b"INITRD01"));

    // e820 is the layout's memory map, entry for entry.
    let expected: Vec<(u64, u64, u64)> = layout.memory_map().iter().map(|e| (e.addr, e.size, e.kind as u64)).collect();
    let found: Vec<(u64, u64, u64)> = serial
        .lines()
        .filter(|l| l.starts_with("zeropage: e820["))
        .map(|l| {
            let kind = l.rsplit_once("type=").unwrap().1.parse().unwrap();
            (hex_after(l, "addr"), hex_after(l, "size"), kind)
        })
        .collect();
    assert_eq!(found, expected, "{ended}");
    assert!(found.contains(&(channel.gpa, channel.size, 2)), "the channel is reserved in e820");
    assert!(serial.contains(&format!("zeropage: {} e820 entries\n", expected.len())), "{ended}");
}

#[test]
fn bzimages_without_a_64_bit_entry_are_configuration_errors() {
    let scratch = Scratch::new("bzimage-refused");
    for (version, xloadflags, reason) in [(bzimage::PROTOCOL_2_15, 0, "64-bit entry"), (0x020b, bzimage::XLF_KERNEL_64, "2.12")] {
        let kernel = write_bzimage(&scratch, version, xloadflags);
        let ended = run_with_args(&["--kernel", &kernel.display().to_string()]);
        assert_eq!(ended.code(), 2, "{ended}");
        let lines = ended.stderr_lines();
        assert_eq!(lines.len(), 1, "one line\n{ended}");
        assert!(lines[0].contains("--kernel") && lines[0].contains(reason), "{ended}");
    }
}
