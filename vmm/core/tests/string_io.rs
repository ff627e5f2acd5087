//! String port I/O (`rep outsb`): one exit carries several accesses, and each reaches the device.

#[macro_use]
mod guest_support;

use guest_support::Scratch;

/// A minimal ELF64 executable: one PT_LOAD of `code` at 1 MiB, entry at its start.
fn elf_image(code: &[u8]) -> Vec<u8> {
    const LOAD_AT: u64 = 0x10_0000;
    let header_size = 64 + 56;
    let mut image = vec![0u8; header_size];
    image[..4].copy_from_slice(b"\x7fELF");
    image[4] = 2; // 64-bit
    image[5] = 1; // little-endian
    image[6] = 1; // version
    image[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    image[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    image[20..24].copy_from_slice(&1u32.to_le_bytes());
    image[24..32].copy_from_slice(&(LOAD_AT + header_size as u64).to_le_bytes()); // entry
    image[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    image[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    image[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    image[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let ph = 64;
    image[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    image[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    image[ph + 16..ph + 24].copy_from_slice(&LOAD_AT.to_le_bytes()); // vaddr
    image[ph + 24..ph + 32].copy_from_slice(&LOAD_AT.to_le_bytes()); // paddr
    let size = (header_size + code.len()) as u64;
    image[ph + 32..ph + 40].copy_from_slice(&size.to_le_bytes()); // filesz
    image[ph + 40..ph + 48].copy_from_slice(&size.to_le_bytes()); // memsz
    image.extend_from_slice(code);
    image
}

#[test]
fn rep_outsb_to_the_serial_port_writes_every_byte() {
    require_kvm!();
    let message = b"string I/O reaches the UART\n";
    let message_at: u32 = 0x10_0000 + 64 + 56 + 32; // the message follows 32 bytes of code
    let mut code = Vec::new();
    code.extend_from_slice(&[0xbe]); // mov esi, imm32
    code.extend_from_slice(&message_at.to_le_bytes());
    code.extend_from_slice(&[0xb9]); // mov ecx, imm32
    code.extend_from_slice(&(message.len() as u32).to_le_bytes());
    code.extend_from_slice(&[0x66, 0xba, 0xf8, 0x03]); // mov dx, 0x3f8
    code.extend_from_slice(&[0xf3, 0x6e]); // rep outsb
    code.extend_from_slice(&[0x31, 0xc0, 0xe6, 0xf4]); // xor eax, eax; out 0xf4, al
    code.extend_from_slice(&[0xf4, 0xeb, 0xfd]); // hlt; jmp hlt
    code.resize(32, 0x90);
    code.extend_from_slice(message);

    let scratch = Scratch::new("string-io");
    let kernel = scratch.path().join("rep-outsb.elf");
    std::fs::write(&kernel, elf_image(&code)).unwrap();
    let serial = scratch.path().join("serial.log");
    let args: Vec<String> = ["--mem", "16M", "--protocol", "direct64", "--serial"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("file:{}", serial.display()), "--kernel".into(), kernel.display().to_string()])
        .collect();
    let mut vm = vmm::Vm::new(vmm::VmConfig::from_args(&args).unwrap()).unwrap();
    vm.start().unwrap();
    assert_eq!(vm.wait_timeout(guest_support::GUEST_TIMEOUT), Some(vmm::StopReason::GuestExit(0)));
    // How many bytes one exit carries is KVM's choice (VMX batches up to a page; PVM's emulator
    // exits per byte); every byte must arrive, in order, either way.
    assert_eq!(std::fs::read(&serial).unwrap(), message);
}
