//! Wraps an ELF64 kernel linked at 1 MiB (the test guest) into a bzImage: a boot sector and one
//! setup sector carrying the Linux boot protocol's setup header (the kernel's
//! `Documentation/arch/x86/boot.rst`), followed by the ELF's loadable bytes laid out flat from
//! 1 MiB. A loader that takes the 64-bit entry (load address + 0x200) boots it; there is no
//! real-mode setup code, so loaders that start a bzImage in real mode cannot.

/// Where the protected-mode image is loaded (`code32_start`), and where the ELF is linked.
pub const LOAD_ADDRESS: u64 = 0x10_0000;
/// Boot protocol 2.15: well past 2.12, which introduced `xloadflags`.
pub const PROTOCOL_2_15: u16 = 0x020f;
/// `xloadflags` bit 0: the kernel has the 64-bit entry at load address + 0x200.
pub const XLF_KERNEL_64: u16 = 1;

/// Setup sectors after the boot sector: the header ends below 0x270, inside the first.
const SETUP_SECTORS: u8 = 1;
const SECTOR: usize = 512;
/// `loadflags` bit 0: the protected-mode image is loaded at 1 MiB.
const LOADED_HIGH: u8 = 1;
const PT_LOAD: u32 = 1;

/// The loadable part of an ELF64 image: every `PT_LOAD` segment's file bytes placed at its
/// physical address relative to `LOAD_ADDRESS`, gaps zeroed; and the end of its memory image
/// (bss included) relative to `LOAD_ADDRESS`.
fn flat_image(elf: &[u8]) -> (Vec<u8>, u64) {
    let u16_at = |offset: usize| u16::from_le_bytes(elf[offset..offset + 2].try_into().unwrap());
    let u32_at = |offset: usize| u32::from_le_bytes(elf[offset..offset + 4].try_into().unwrap());
    let u64_at = |offset: usize| u64::from_le_bytes(elf[offset..offset + 8].try_into().unwrap());
    assert!(elf.len() > 0x40 && elf[..4] == *b"\x7fELF" && elf[4] == 2, "not an ELF64 image");
    let (header_table, header_size, header_count) = (u64_at(0x20) as usize, u16_at(0x36) as usize, u16_at(0x38) as usize);
    let mut flat = Vec::new();
    let mut memory_end = 0;
    for index in 0..header_count {
        let header = header_table + index * header_size;
        if u32_at(header) != PT_LOAD {
            continue;
        }
        let (file_offset, physical, file_size, memory_size) =
            (u64_at(header + 8) as usize, u64_at(header + 0x18), u64_at(header + 0x20) as usize, u64_at(header + 0x28));
        let start = physical.checked_sub(LOAD_ADDRESS).expect("segments are linked at or above 1 MiB") as usize;
        if flat.len() < start + file_size {
            flat.resize(start + file_size, 0);
        }
        flat[start..start + file_size].copy_from_slice(&elf[file_offset..file_offset + file_size]);
        memory_end = memory_end.max(start as u64 + memory_size);
    }
    assert!(!flat.is_empty(), "the ELF has no loadable bytes");
    (flat, memory_end)
}

/// A bzImage of `elf` announcing boot protocol `version` and `xloadflags`.
pub fn from_elf(elf: &[u8], version: u16, xloadflags: u16) -> Vec<u8> {
    let (payload, memory_end) = flat_image(elf);
    let mut image = vec![0u8; (1 + SETUP_SECTORS as usize) * SECTOR];
    let mut put = |offset: usize, bytes: &[u8]| image[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(0x1f1, &[SETUP_SECTORS]);
    put(0x1f4, &(payload.len().div_ceil(16) as u32).to_le_bytes()); // syssize, in 16-byte units
    put(0x1fe, &0xaa55u16.to_le_bytes()); // boot_flag
    put(0x202, b"HdrS");
    put(0x206, &version.to_le_bytes());
    put(0x211, &[LOADED_HIGH]); // loadflags
    put(0x214, &(LOAD_ADDRESS as u32).to_le_bytes()); // code32_start
    put(0x22c, &0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    put(0x230, &0x1000u32.to_le_bytes()); // kernel_alignment (not relocatable: unused)
    put(0x236, &xloadflags.to_le_bytes());
    put(0x238, &4095u32.to_le_bytes()); // cmdline_size: the longest command line we take
    put(0x258, &LOAD_ADDRESS.to_le_bytes()); // pref_address
    put(0x260, &(memory_end as u32).to_le_bytes()); // init_size: the image with its bss
    image.extend_from_slice(&payload);
    image
}
