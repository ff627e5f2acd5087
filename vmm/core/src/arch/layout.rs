//! Where the VMM puts things in guest-physical memory (docs/guest-abi.md is the contract).

pub const PAGE_SIZE: u64 = 4096;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub const GDT_ADDR: u64 = 0x500;
pub const START_INFO_ADDR: u64 = 0x6000;
pub const MODLIST_ADDR: u64 = 0x6040;
pub const MEMMAP_ADDR: u64 = 0x6800;
/// Room for memory-map entries between `MEMMAP_ADDR` and the zero page.
pub const MEMMAP_MAX_ENTRIES: usize = (ZERO_PAGE_ADDR - MEMMAP_ADDR) as usize / 24;
pub const MODLIST_MAX_ENTRIES: usize = (MEMMAP_ADDR - MODLIST_ADDR) as usize / 32;
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Stack for the Linux boot protocol's 64-bit entry.
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
/// Four page directories identity-map the low 4 GiB with 2 MiB pages.
pub const PD_ADDR: u64 = 0xb000;
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Including the terminating NUL.
pub const CMDLINE_MAX: usize = 4096;
/// The legacy hole below 1 MiB (EBDA, VGA, BIOS) is reserved in the memory map.
pub const EBDA_START: u64 = 0x9fc00;
pub const HIGH_MEMORY_START: u64 = MIB;
/// RAM above this continues at 4 GiB: the hole is for MMIO (LAPIC, IOAPIC, devices).
pub const LOW_RAM_MAX: u64 = 3 * GIB;
pub const MMIO_HOLE_END: u64 = 4 * GIB;
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// Smallest VM: kernel at 1 MiB plus room for boot structures and the channel.
pub const MIN_RAM: u64 = 2 * MIB;
