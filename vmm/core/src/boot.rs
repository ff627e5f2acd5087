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
    /// The kernel is Linux: a bzImage, or an ELF whose Xen guest-OS note says "linux". Linux
    /// probes legacy ports and uses every CPU feature it is shown.
    pub linux_guest: bool,
}

impl BootPlan {
    /// The start state of vCPU `index`; `None` for a vCPU that waits for INIT/SIPI.
    pub fn start_mode(&self, index: usize, sipi: bool) -> Option<StartMode> {
        match self.protocol {
            BootProtocol::Direct64 if index == 0 || !sipi => Some(StartMode::Long64 { entry: self.entry, vcpu_index: index as u64 }),
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
    if elf64::FileHeader::parse(&head[..n]).is_ok_and(|header| header.is_x86_64()) {
        return Ok(ImageKind::Elf64);
    }
    if n >= 0x206 && u32::from_le_bytes(head[0x202..0x206].try_into().unwrap()) == zero_page::HDRS_MAGIC {
        return Ok(ImageKind::BzImage);
    }
    Err(VmError::Config(format!("boot.kernel: {} is neither an x86-64 ELF64 image nor a bzImage", path.display())))
}

/// The guest OS an ELF kernel names in its Xen `GUEST_OS` note ("linux" for vmlinux), if any;
/// "linux" too for a kernel carrying Linux's own notes (owner "Linux": the build salt every
/// vmlinux has), which a kernel built without Xen support has instead of the Xen note.
/// Reads only within `image`; a malformed header or note yields `None`.
pub fn elf_guest_os(image: &[u8]) -> Option<String> {
    let header = elf64::FileHeader::parse(image).ok()?;
    for index in 0..header.program_header_count {
        let entry = image.get(usize::try_from(header.program_header_offset(index)?).ok()?..)?;
        let segment = elf64::ProgramHeader::parse(entry)?;
        if segment.kind != elf64::PT_NOTE {
            continue;
        }
        let guest_os = elf64::notes(segment.file_bytes(image)?)
            .find(|note| note.name == elf64::XEN_NOTE_NAME && note.kind == elf64::XEN_ELFNOTE_GUEST_OS);
        if let Some(note) = guest_os {
            let text = note.descriptor.split(|b| *b == 0).next()?;
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        if elf64::notes(segment.file_bytes(image)?).any(|note| note.name == LINUX_NOTE_NAME) {
            return Some("linux".into());
        }
    }
    None
}

/// The owner name of the notes Linux puts in every vmlinux (include/linux/elfnote.h).
const LINUX_NOTE_NAME: &[u8] = b"Linux\0";

/// The user's command line with the VMM's `clowder.*` words added before a `--` word, if any:
/// what follows `--` belongs to the kernel's init (Linux) or job (the LWK), not to the kernel.
pub fn kernel_command_line(user: &str, extra: &[String]) -> String {
    let words = extra.join(" ");
    let separator = if user.starts_with("-- ") || user == "--" {
        Some(0)
    } else {
        user.find(" -- ").map(|i| i + 1).or_else(|| user.strip_suffix(" --").map(|rest| rest.len() + 1))
    };
    match (separator, words.is_empty()) {
        (_, true) => user.to_string(),
        (Some(at), false) => format!("{}{words} {}", &user[..at], &user[at..]),
        (None, false) if user.is_empty() => words,
        (None, false) => format!("{user} {words}"),
    }
}

fn read_file(key: &str, path: &Path) -> Result<Vec<u8>, VmError> {
    std::fs::read(path).map_err(|e| VmError::Config(format!("{key}: {}: {e}", path.display())))
}

/// Loads everything and returns the plan. `cmdline_extra` are the `clowder.*` words the devices
/// asked for.
pub fn load(memory: &GuestMemory, boot: &BootConfig, cmdline_extra: &[String]) -> Result<BootPlan, VmError> {
    let mem = memory.guest_memory();
    let write = |gpa: u64, bytes: &[u8], what: &str| {
        mem.write_slice(bytes, GuestAddress(gpa)).map_err(|e| VmError::Config(format!("{what} does not fit in guest memory: {e}")))
    };
    let kind = image_kind(&boot.kernel)?;
    let mut image = File::open(&boot.kernel).map_err(|e| VmError::Config(format!("boot.kernel: {e}")))?;
    let highmem = Some(GuestAddress(HIGH_MEMORY_START));
    let linux_guest = match kind {
        ImageKind::BzImage => true,
        ImageKind::Elf64 => elf_guest_os(&read_file("boot.kernel", &boot.kernel)?).as_deref() == Some("linux"),
    };
    let (protocol, entry, kernel_end, setup_header) = match kind {
        ImageKind::Elf64 => {
            let loaded =
                Elf::load(mem, None, &mut image, highmem).map_err(|e| VmError::Config(format!("boot.kernel: loading ELF: {e}")))?;
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
            let loaded =
                BzImage::load(mem, None, &mut image, highmem).map_err(|e| VmError::Config(format!("boot.kernel: loading bzImage: {e}")))?;
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

    let mut extra = cmdline_extra.to_vec();
    if linux_guest && crate::arch::cpuid::on_pvm() {
        extra.extend(crate::arch::cpuid::LINUX_ON_PVM.iter().map(|word| word.to_string()));
    }
    let cmdline = kernel_command_line(&boot.cmdline, &extra);
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
            // The kernel states its own command-line limit (boot protocol 2.06+).
            let limit = header.cmdline_size as usize;
            if limit != 0 && cmdline_bytes.len() - 1 > limit {
                return Err(VmError::Config(format!(
                    "boot.cmdline: {} bytes with the VMM's clowder.* keys, this kernel accepts at most {limit}",
                    cmdline_bytes.len() - 1
                )));
            }
            let initrd = modules.first().map(|m| zero_page::Initrd { gpa: m.gpa, size: m.size });
            let params = zero_page::build(header, &memory_map, initrd);
            mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR)).map_err(|e| VmError::Config(format!("zero page: {e}")))?;
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
    Ok(BootPlan { protocol, entry, modules_loaded: modules.len(), linux_guest })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header with one PT_NOTE segment holding `notes`.
    fn elf_with_notes(notes: &[(&[u8], u32, &[u8])]) -> Vec<u8> {
        let mut note_bytes = Vec::new();
        for (name, kind, desc) in notes {
            note_bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            note_bytes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            note_bytes.extend_from_slice(&kind.to_le_bytes());
            note_bytes.extend_from_slice(name);
            note_bytes.resize(note_bytes.len().div_ceil(4) * 4, 0);
            note_bytes.extend_from_slice(desc);
            note_bytes.resize(note_bytes.len().div_ceil(4) * 4, 0);
        }
        let mut image = vec![0u8; 0x40 + 56];
        image[..4].copy_from_slice(b"\x7fELF");
        image[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        image[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        image[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let ph = 0x40;
        image[ph..ph + 4].copy_from_slice(&elf64::PT_NOTE.to_le_bytes());
        image[ph + 8..ph + 16].copy_from_slice(&((0x40 + 56) as u64).to_le_bytes());
        image[ph + 32..ph + 40].copy_from_slice(&(note_bytes.len() as u64).to_le_bytes());
        image.extend_from_slice(&note_bytes);
        image
    }

    #[test]
    fn vmm_words_go_before_the_init_arguments() {
        let extra = ["clowder.cpus=1".to_string(), "clowder.exit_port=0xf4".to_string()];
        let line = |user: &str| kernel_command_line(user, &extra);
        assert_eq!(line(""), "clowder.cpus=1 clowder.exit_port=0xf4");
        assert_eq!(line("console=ttyS0"), "console=ttyS0 clowder.cpus=1 clowder.exit_port=0xf4");
        assert_eq!(line("-- hpccg 8 8 8"), "clowder.cpus=1 clowder.exit_port=0xf4 -- hpccg 8 8 8");
        assert_eq!(line("lwk.heap=1G -- a -- b"), "lwk.heap=1G clowder.cpus=1 clowder.exit_port=0xf4 -- a -- b");
        assert_eq!(line("quiet --"), "quiet clowder.cpus=1 clowder.exit_port=0xf4 --");
        assert_eq!(line("a--b"), "a--b clowder.cpus=1 clowder.exit_port=0xf4");
        assert_eq!(kernel_command_line("x -- y", &[]), "x -- y");
    }

    #[test]
    fn finds_the_guest_os_note_among_others() {
        let image = elf_with_notes(&[(b"Xen\0", 18, &[0, 0, 0, 1]), (b"Xen\0", 6, b"linux\0")]);
        assert_eq!(elf_guest_os(&image).as_deref(), Some("linux"));
        let other = elf_with_notes(&[(b"GNU\0", 6, b"linux\0")]);
        assert_eq!(elf_guest_os(&other), None);
        let without_xen = elf_with_notes(&[(b"Xen\0", 18, &[0, 0, 0, 1]), (b"Linux\0", 0x100, &[0; 4])]);
        assert_eq!(elf_guest_os(&without_xen).as_deref(), Some("linux"));
    }

    #[test]
    fn malformed_notes_are_not_read_out_of_bounds() {
        let mut image = elf_with_notes(&[(b"Xen\0", 6, b"linux\0")]);
        let note = 0x40 + 56;
        image[note + 4..note + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(elf_guest_os(&image), None);
        assert_eq!(elf_guest_os(&image[..0x30]), None);
        let mut huge_phnum = elf_with_notes(&[]);
        huge_phnum[0x38..0x3a].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(elf_guest_os(&huge_phnum), None);
    }
}
