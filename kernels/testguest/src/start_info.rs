//! The PVH `hvm_start_info` and what hangs off it (Xen's `arch-x86/hvm/start_info.h`).

pub const MAGIC: u32 = 0x336e_c578;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StartInfo {
    pub magic: u32,
    pub version: u32,
    pub flags: u32,
    pub nr_modules: u32,
    pub modlist_paddr: u64,
    pub cmdline_paddr: u64,
    pub rsdp_paddr: u64,
    /// Version 1 and later only.
    pub memmap_paddr: u64,
    pub memmap_entries: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Module {
    pub paddr: u64,
    pub size: u64,
    pub cmdline_paddr: u64,
    pub reserved: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemoryMapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
    pub reserved: u32,
}

/// Bounds on what we read, whatever the header claims.
pub const MAX_MODULES: usize = 16;
pub const MAX_MEMMAP_ENTRIES: usize = 64;
/// The ABI's limit on the command line, NUL excluded.
pub const MAX_CMDLINE: usize = 4095;

/// Reads the start info at `address` (identity mapped); `None` if the magic is wrong.
pub fn read(address: u64) -> Option<StartInfo> {
    if address == 0 {
        return None;
    }
    // SAFETY: the VMM (or QEMU) put the structure there; it lies in low, identity-mapped RAM.
    let info = unsafe { core::ptr::read_volatile(address as *const StartInfo) };
    (info.magic == MAGIC).then_some(info)
}

impl StartInfo {
    pub fn modules(&self) -> impl Iterator<Item = Module> + '_ {
        let count = (self.nr_modules as usize).min(MAX_MODULES);
        let base = self.modlist_paddr;
        (0..count).map(move |index| {
            // SAFETY: as for `read`; the count is bounded.
            unsafe { core::ptr::read_volatile((base as *const Module).add(index)) }
        })
    }

    pub fn memory_map(&self) -> impl Iterator<Item = MemoryMapEntry> + '_ {
        let count = if self.version >= 1 { (self.memmap_entries as usize).min(MAX_MEMMAP_ENTRIES) } else { 0 };
        let base = self.memmap_paddr;
        (0..count).map(move |index| {
            // SAFETY: as for `read`; the count is bounded.
            unsafe { core::ptr::read_volatile((base as *const MemoryMapEntry).add(index)) }
        })
    }

    /// The NUL-terminated command line (at most 4095 bytes), or "" if there is none.
    pub fn cmdline(&self) -> &'static str {
        cmdline_at(self.cmdline_paddr)
    }
}

pub fn cmdline_at(address: u64) -> &'static str {
    if address == 0 {
        return "";
    }
    // SAFETY: the command line lies in low, identity-mapped RAM and nobody changes it.
    let bytes = unsafe { core::slice::from_raw_parts(address as *const u8, MAX_CMDLINE) };
    let length = bytes.iter().position(|&byte| byte == 0).unwrap_or(MAX_CMDLINE);
    core::str::from_utf8(&bytes[..length]).unwrap_or("")
}
