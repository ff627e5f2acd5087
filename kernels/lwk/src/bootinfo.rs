//! The PVH `hvm_start_info` the boot loader leaves in memory: memory map and modules, copied
//! out before the memory they sit in can be reused, and the command line, read in place (its
//! range is kept out of the free memory; copying 4 KiB is emulated work on PVM).

use crate::arch::phys;

const START_INFO_MAGIC: u32 = 0x336e_c578;
const MAX_MEMORY_RANGES: usize = 64;
const MAX_MODULES: usize = 8;
const MAX_COMMAND_LINE: usize = 4096;
pub const E820_RAM: u32 = 1;

#[derive(Clone, Copy, Default, Debug)]
pub struct MemoryRange {
    pub start: u64,
    pub size: u64,
    pub kind: u32,
}

#[derive(Clone, Copy, Default, Debug)]
pub struct Module {
    pub start: u64,
    pub size: u64,
}

pub struct BootInfo {
    memory_map: [MemoryRange; MAX_MEMORY_RANGES],
    memory_map_len: usize,
    modules: [Module; MAX_MODULES],
    modules_len: usize,
    command_line: &'static str,
    /// Physical range of the command line, to keep while it is in use.
    pub command_line_range: (u64, u64),
}

#[derive(Debug)]
#[allow(dead_code)] // the fields are read through `Debug` in the panic message
pub enum BootInfoError {
    BadMagic(u32),
    NoMemoryMap,
}

impl BootInfo {
    pub fn parse(start_info: u64) -> Result<BootInfo, BootInfoError> {
        let magic: u32 = phys::read(start_info);
        if magic != START_INFO_MAGIC {
            return Err(BootInfoError::BadMagic(magic));
        }
        let version: u32 = phys::read(start_info + 4);
        let module_count: u32 = phys::read(start_info + 12);
        let module_list: u64 = phys::read(start_info + 16);
        let command_line_address: u64 = phys::read(start_info + 24);
        let (memory_map_address, memory_map_entries) =
            if version >= 1 { (phys::read::<u64>(start_info + 40), phys::read::<u32>(start_info + 48)) } else { (0, 0) };
        if memory_map_entries == 0 {
            return Err(BootInfoError::NoMemoryMap);
        }

        let mut info = BootInfo {
            memory_map: [MemoryRange::default(); MAX_MEMORY_RANGES],
            memory_map_len: 0,
            modules: [Module::default(); MAX_MODULES],
            modules_len: 0,
            command_line: "",
            command_line_range: (0, 0),
        };
        for i in 0..(memory_map_entries as usize).min(MAX_MEMORY_RANGES) {
            let entry = memory_map_address + i as u64 * 24;
            info.memory_map[i] = MemoryRange { start: phys::read(entry), size: phys::read(entry + 8), kind: phys::read(entry + 16) };
            info.memory_map_len += 1;
        }
        for i in 0..(module_count as usize).min(MAX_MODULES) {
            let entry = module_list + i as u64 * 32;
            info.modules[i] = Module { start: phys::read(entry), size: phys::read(entry + 8) };
            info.modules_len += 1;
        }
        if command_line_address != 0 {
            let window = phys::bytes(command_line_address, MAX_COMMAND_LINE);
            let len = window.iter().position(|&byte| byte == 0).unwrap_or(MAX_COMMAND_LINE);
            // Not UTF-8 makes it empty: the kernel only parses ASCII.
            info.command_line = core::str::from_utf8(&window[..len]).unwrap_or("");
            info.command_line_range = (command_line_address, command_line_address + len as u64 + 1);
        }
        Ok(info)
    }

    pub fn memory_map(&self) -> &[MemoryRange] {
        &self.memory_map[..self.memory_map_len]
    }

    pub fn modules(&self) -> &[Module] {
        &self.modules[..self.modules_len]
    }

    pub fn command_line(&self) -> &'static str {
        self.command_line
    }
}
