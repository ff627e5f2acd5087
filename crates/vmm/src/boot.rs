//! Loads the kernel and modules into guest memory and writes the boot structures the chosen
//! protocol needs (PVH start_info, Linux zero page, GDT, identity page tables, command line).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress};
use vmm_config::{BootConfig, BootProtocol};

use crate::arch::layout::*;
use crate::arch::regs::StartMode;
use crate::arch::{gdt, paging, pvh, zero_page};
use crate::memory::GuestMemory;
use crate::VmError;

/// How the vCPUs will be started once the image is in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootPlan {
    pub protocol: BootProtocol,
    pub entry: u64,
    pub modules_loaded: usize,
}

impl BootPlan {
    /// The start state of vCPU `index`; `None` for a vCPU that waits for INIT/SIPI.
    pub fn start_mode(&self, index: usize, sipi: bool) -> Option<StartMode> {
        match self.protocol {
            BootProtocol::Direct64 if index == 0 || !sipi => {
                Some(StartMode::Long64 { entry: self.entry, vcpu_index: index as u64 })
            }
            BootProtocol::Pvh if index == 0 => Some(StartMode::Pvh32 { entry: self.entry }),
            BootProtocol::Linux if index == 0 => Some(StartMode::Linux64 { entry: self.entry }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageKind {
    Elf64,
    BzImage,
}

fn image_kind(path: &Path) -> Result<ImageKind, VmError> {
    let mut head = [0u8; 0x210];
    let mut file = File::open(path).map_err(|e| VmError::Config(format!("boot.kernel: {}: {e}", path.display())))?;
    let n = file.read(&mut head).map_err(|e| VmError::Config(format!("boot.kernel: {}: {e}", path.display())))?;
    if n >= 20 && head[..4] == *b"\x7fELF" && head[4] == 2 && u16::from_le_bytes([head[18], head[19]]) == 62 {
        return Ok(ImageKind::Elf64);
    }
    if n >= 0x206 && u32::from_le_bytes(head[0x202..0x206].try_into().unwrap()) == zero_page::HDRS_MAGIC {
        return Ok(ImageKind::BzImage);
    }
    Err(VmError::Config(format!("boot.kernel: {} is neither an x86-64 ELF64 image nor a bzImage", path.display())))
}

fn read_file(key: &str, path: &Path) -> Result<Vec<u8>, VmError> {
    std::fs::read(path).map_err(|e| VmError::Config(format!("{key}: {}: {e}", path.display())))
}

/// Loads everything and returns the plan. `cmdline_extra` are the `clowder.*` words the devices
/// asked for.
pub fn load(memory: &GuestMemory, boot: &BootConfig, cmdline_extra: &[String]) -> Result<BootPlan, VmError> {
    let mem = memory.guest_memory();
    let write = |gpa: u64, bytes: &[u8], what: &str| {
        mem.write_slice(bytes, GuestAddress(gpa))
            .map_err(|e| VmError::Config(format!("{what} does not fit in guest memory: {e}")))
    };
    let kind = image_kind(&boot.kernel)?;
    let mut image = File::open(&boot.kernel).map_err(|e| VmError::Config(format!("boot.kernel: {e}")))?;
    let highmem = Some(GuestAddress(HIGH_MEMORY_START));
    let (protocol, entry, kernel_end, setup_header) = match kind {
        ImageKind::Elf64 => {
            let loaded = Elf::load(mem, None, &mut image, highmem)
                .map_err(|e| VmError::Config(format!("boot.kernel: loading ELF: {e}")))?;
            let pvh_entry = match loaded.pvh_boot_cap {
                PvhBootCapability::PvhEntryPresent(addr) => Some(addr.0),
                _ => None,
            };
            let protocol = match (boot.protocol, pvh_entry) {
                (BootProtocol::Auto, Some(_)) | (BootProtocol::Pvh, Some(_)) => BootProtocol::Pvh,
                (BootProtocol::Auto, None) | (BootProtocol::Direct64, _) => BootProtocol::Direct64,
                (BootProtocol::Pvh, None) => {
                    return Err(VmError::Config("boot.protocol: pvh needs an ELF with a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY)".into()))
                }
                (BootProtocol::Linux, _) => {
                    return Err(VmError::Config("boot.protocol: linux needs a bzImage, the kernel is an ELF".into()))
                }
            };
            let entry = if protocol == BootProtocol::Pvh { pvh_entry.unwrap() } else { loaded.kernel_load.0 };
            (protocol, entry, loaded.kernel_end, None)
        }
        ImageKind::BzImage => {
            if !matches!(boot.protocol, BootProtocol::Auto | BootProtocol::Linux) {
                return Err(VmError::Config("boot.protocol: a bzImage boots only with the Linux protocol".into()));
            }
            let loaded = BzImage::load(mem, None, &mut image, highmem)
                .map_err(|e| VmError::Config(format!("boot.kernel: loading bzImage: {e}")))?;
            // The 64-bit entry point sits 0x200 bytes into the protected-mode kernel.
            (BootProtocol::Linux, loaded.kernel_load.0 + 0x200, loaded.kernel_end, loaded.setup_header)
        }
    };

    let layout = memory.layout();
    if kernel_end > layout.low_usable_end() {
        return Err(VmError::Config(format!(
            "boot.kernel: the image ends at {kernel_end:#x}, beyond usable low RAM ({:#x}); give the VM more memory",
            layout.low_usable_end()
        )));
    }
    // Modules go at the top of usable low RAM, downwards, page aligned, above the kernel.
    let mut top = layout.low_usable_end();
    let mut modules = Vec::new();
    for (i, path) in boot.modules.iter().enumerate() {
        let key = format!("boot.modules[{i}]");
        let bytes = read_file(&key, path)?;
        let size = bytes.len() as u64;
        let gpa = top.checked_sub(size).map(|a| a & !(PAGE_SIZE - 1)).filter(|a| *a >= kernel_end.max(HIGH_MEMORY_START));
        let Some(gpa) = gpa else {
            return Err(VmError::Config(format!(
                "{key}: {} ({size} bytes) does not fit in guest RAM between the kernel (ends at {kernel_end:#x}) and {top:#x}; give the VM more memory",
                path.display()
            )));
        };
        write(gpa, &bytes, &key)?;
        modules.push(pvh::Module { gpa, size });
        top = gpa;
    }
    // PVH wants modules in the order given; they were placed top-down, which keeps that order.

    let mut cmdline = boot.cmdline.clone();
    for word in cmdline_extra {
        if !cmdline.is_empty() {
            cmdline.push(' ');
        }
        cmdline.push_str(word);
    }
    if cmdline.len() >= CMDLINE_MAX {
        return Err(VmError::Config(format!(
            "boot.cmdline: {} bytes with the VMM's clowder.* keys, at most {} fit",
            cmdline.len(),
            CMDLINE_MAX - 1
        )));
    }
    let mut cmdline_bytes = cmdline.into_bytes();
    cmdline_bytes.push(0);
    write(CMDLINE_ADDR, &cmdline_bytes, "command line")?;

    let gdt: Vec<u8> = gdt::boot_gdt().iter().flat_map(|d| d.to_le_bytes()).collect();
    write(GDT_ADDR, &gdt, "GDT")?;
    let memory_map = layout.memory_map();
    match protocol {
        BootProtocol::Linux => {
            let header = setup_header.expect("bzImage loader returns its header");
            let initrd = modules.first().map(|m| zero_page::Initrd { gpa: m.gpa, size: m.size });
            let params = zero_page::build(header, &memory_map, cmdline_bytes.len() - 1, initrd);
            mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR))
                .map_err(|e| VmError::Config(format!("zero page: {e}")))?;
        }
        BootProtocol::Pvh | BootProtocol::Direct64 | BootProtocol::Auto => {
            let blobs = pvh::build(&memory_map, &modules).map_err(|e| VmError::Config(format!("boot.modules: {e}")))?;
            write(START_INFO_ADDR, &blobs.start_info, "start_info")?;
            write(MODLIST_ADDR, &blobs.modlist, "module list")?;
            write(MEMMAP_ADDR, &blobs.memmap, "memory map")?;
        }
    }
    if protocol != BootProtocol::Pvh {
        for (gpa, page) in paging::identity_tables() {
            write(gpa, &page, "page tables")?;
        }
    }
    Ok(BootPlan { protocol, entry, modules_loaded: modules.len() })
}
