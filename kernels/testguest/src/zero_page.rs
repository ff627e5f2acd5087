//! The Linux boot protocol's zero page (`struct boot_params`; the kernel's
//! `Documentation/arch/x86/zero-page.rst` and `boot.rst`), as far as the `zeropage` test reads it.
//! Fields are read at their documented offsets rather than through a full `#[repr(C, packed)]`
//! copy of the structure: the test needs a dozen of them.

/// "HdrS", the setup header's magic.
pub const HDRS_MAGIC: u32 = 0x5372_6448;

const EXT_RAMDISK_IMAGE: u64 = 0x0c0;
const EXT_RAMDISK_SIZE: u64 = 0x0c4;
const EXT_CMD_LINE_PTR: u64 = 0x0c8;
const E820_ENTRIES: u64 = 0x1e8;
const HEADER: u64 = 0x202;
const VERSION: u64 = 0x206;
const TYPE_OF_LOADER: u64 = 0x210;
const LOADFLAGS: u64 = 0x211;
const RAMDISK_IMAGE: u64 = 0x218;
const RAMDISK_SIZE: u64 = 0x21c;
const CMD_LINE_PTR: u64 = 0x228;
const XLOADFLAGS: u64 = 0x236;
const E820_TABLE: u64 = 0x2d0;
/// `struct boot_e820_entry`: addr u64, size u64, type u32, packed.
const E820_ENTRY_SIZE: u64 = 20;
/// Room in `e820_table`.
pub const E820_MAX_ENTRIES: usize = 128;

#[derive(Clone, Copy, Debug)]
pub struct ZeroPage {
    pub address: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

impl ZeroPage {
    pub fn at(address: u64) -> ZeroPage {
        ZeroPage { address }
    }

    fn read<T: Copy>(&self, offset: u64) -> T {
        // SAFETY: the zero page is a 4 KiB page of low, identity-mapped RAM the VMM filled;
        // fields in it are not naturally aligned, hence the unaligned read.
        unsafe { core::ptr::read_unaligned((self.address + offset) as *const T) }
    }

    pub fn header_magic(&self) -> u32 {
        self.read(HEADER)
    }

    pub fn version(&self) -> u16 {
        self.read(VERSION)
    }

    pub fn type_of_loader(&self) -> u8 {
        self.read(TYPE_OF_LOADER)
    }

    pub fn loadflags(&self) -> u8 {
        self.read(LOADFLAGS)
    }

    pub fn xloadflags(&self) -> u16 {
        self.read(XLOADFLAGS)
    }

    /// `cmd_line_ptr`, with its high half from `ext_cmd_line_ptr`.
    pub fn cmdline_address(&self) -> u64 {
        u64::from(self.read::<u32>(CMD_LINE_PTR)) | u64::from(self.read::<u32>(EXT_CMD_LINE_PTR)) << 32
    }

    /// The initrd's address and size (`ramdisk_image`/`ramdisk_size` and their `ext_` halves).
    pub fn initrd(&self) -> (u64, u64) {
        let address = u64::from(self.read::<u32>(RAMDISK_IMAGE)) | u64::from(self.read::<u32>(EXT_RAMDISK_IMAGE)) << 32;
        let size = u64::from(self.read::<u32>(RAMDISK_SIZE)) | u64::from(self.read::<u32>(EXT_RAMDISK_SIZE)) << 32;
        (address, size)
    }

    /// The e820 entries the loader filled in (bounded by the table's size).
    pub fn e820(&self) -> impl Iterator<Item = E820Entry> + '_ {
        let count = usize::from(self.read::<u8>(E820_ENTRIES)).min(E820_MAX_ENTRIES);
        (0..count as u64).map(move |index| {
            let entry = E820_TABLE + index * E820_ENTRY_SIZE;
            E820Entry { addr: self.read(entry), size: self.read(entry + 8), kind: self.read(entry + 16) }
        })
    }
}
