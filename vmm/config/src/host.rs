//! What validation needs to know about the host and the kernel image, read before any KVM object
//! exists so that a bad configuration fails with a clear message instead of a failed ioctl.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use hwspec::parse_cpu_list;

const HUGEPAGES_2M_DIR: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// Host facts validation depends on; tests build their own instead of probing.
#[derive(Debug)]
pub(crate) struct HostFacts {
    /// CPUs that are online and in this process's affinity mask, sorted.
    pub usable_cpus: Vec<usize>,
    /// The 2 MiB hugepage pool; `None` when the kernel has none.
    pub hugepages_2m: Option<HugePagePool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HugePagePool {
    /// `nr_hugepages`: the size of the pool (what `sysctl vm.nr_hugepages` sets).
    pub total: u64,
    pub free: u64,
}

impl HostFacts {
    pub(crate) fn probe() -> HostFacts {
        let allowed = allowed_cpus();
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|text| parse_cpu_list(&text).ok());
        let usable_cpus = match online {
            Some(online) => allowed.into_iter().filter(|cpu| online.contains(cpu)).collect(),
            // Without sysfs the affinity mask is the best information there is.
            None => allowed,
        };
        HostFacts { usable_cpus, hugepages_2m: probe_hugepages_2m() }
    }
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data for which all-zero is a valid (empty) set, and
    // sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
    }
}

fn probe_hugepages_2m() -> Option<HugePagePool> {
    let read_count =
        |name: &str| -> Option<u64> { std::fs::read_to_string(format!("{HUGEPAGES_2M_DIR}/{name}")).ok()?.trim().parse().ok() };
    Some(HugePagePool { total: read_count("nr_hugepages")?, free: read_count("free_hugepages")? })
}

/// What kind of kernel image a file is, as far as choosing a boot protocol needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelImage {
    Elf64 { has_pvh_note: bool },
    BzImage,
}

/// Notes larger than this are not kernel notes; the cap keeps a corrupt header from making us read
/// a whole file.
const MAX_NOTE_SEGMENT: u64 = 1 << 20;

const BZIMAGE_MAGIC_OFFSET: usize = 0x202;
const BZIMAGE_VERSION_OFFSET: usize = 0x206;
const BZIMAGE_XLOADFLAGS_OFFSET: usize = 0x236;
/// The first boot protocol with a relocatable kernel and the `cmdline_size` field.
const BZIMAGE_MIN_VERSION: u16 = 0x0206;
/// `xloadflags` (with its XLF_KERNEL_64 bit) exists from boot protocol 2.12.
const BZIMAGE_XLOADFLAGS_VERSION: u16 = 0x020c;
const XLF_KERNEL_64: u16 = 1;

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

/// Opens `path` and checks it is a file we can read; the reason names the path.
pub(crate) fn open_readable(path: &Path) -> Result<File, String> {
    let file = File::open(path).map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    match file.metadata() {
        Ok(metadata) if metadata.is_dir() => Err(format!("{} is a directory", path.display())),
        Ok(_) => Ok(file),
        Err(error) => Err(format!("cannot read {}: {error}", path.display())),
    }
}

/// Reads enough of `path` to tell an x86-64 ELF64 (and whether it has a PVH entry note) from a
/// 64-bit-capable bzImage; anything else is refused with the reason.
pub(crate) fn inspect_kernel(path: &Path) -> Result<KernelImage, String> {
    let mut file = open_readable(path)?;
    let mut header = Vec::with_capacity(4096);
    (&mut file).take(4096).read_to_end(&mut header).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let shown = path.display();

    match elf64::FileHeader::parse(&header) {
        Err(elf64::HeaderError::NotElf) => {}
        Err(elf64::HeaderError::Truncated) => return Err(format!("{shown} is a truncated ELF file")),
        Ok(elf) => {
            if elf.class != elf64::CLASS_64 {
                return Err(format!("{shown} is a 32-bit ELF; the kernel must be an ELF64 for x86-64 or a bzImage"));
            }
            if elf.data_encoding != elf64::LITTLE_ENDIAN {
                return Err(format!("{shown} is a big-endian ELF, not an x86-64 kernel"));
            }
            if elf.machine != elf64::EM_X86_64 {
                return Err(format!("{shown} is an ELF64 for machine {}, not x86-64 ({})", elf.machine, elf64::EM_X86_64));
            }
            let has_pvh_note =
                has_pvh_note(&mut file, &elf).map_err(|error| format!("cannot read the program headers of {shown}: {error}"))?;
            return Ok(KernelImage::Elf64 { has_pvh_note });
        }
    }

    if header.len() >= BZIMAGE_XLOADFLAGS_OFFSET + 2 && &header[BZIMAGE_MAGIC_OFFSET..BZIMAGE_MAGIC_OFFSET + 4] == b"HdrS" {
        let version = u16_at(&header, BZIMAGE_VERSION_OFFSET);
        let (major, minor) = (version >> 8, version & 0xff);
        if version < BZIMAGE_MIN_VERSION {
            return Err(format!("{shown} is a bzImage with boot protocol {major}.{minor:02}; at least 2.06 is needed"));
        }
        if version < BZIMAGE_XLOADFLAGS_VERSION {
            return Err(format!("{shown} is a bzImage with boot protocol {major}.{minor:02}, which predates the 64-bit entry flag (2.12)"));
        }
        if u16_at(&header, BZIMAGE_XLOADFLAGS_OFFSET) & XLF_KERNEL_64 == 0 {
            return Err(format!("{shown} is a bzImage without a 64-bit entry point (xloadflags bit 0 is clear)"));
        }
        return Ok(KernelImage::BzImage);
    }

    Err(format!("{shown} is neither an ELF64 x86-64 kernel nor a bzImage (no \\x7fELF magic, no HdrS at 0x202)"))
}

/// Looks for a Xen `PHYS32_ENTRY` note in the PT_NOTE segments.
fn has_pvh_note(file: &mut File, elf: &elf64::FileHeader) -> std::io::Result<bool> {
    if !elf.has_readable_program_headers() {
        return Ok(false);
    }
    let mut entry = vec![0u8; usize::from(elf.program_header_size)];
    for index in 0..elf.program_header_count {
        // A corrupt offset must fail the read below, not overflow.
        let entry_offset = elf.program_header_offset(index).unwrap_or(u64::MAX);
        file.seek(SeekFrom::Start(entry_offset))?;
        file.read_exact(&mut entry)?;
        let Some(segment) = elf64::ProgramHeader::parse(&entry) else { continue };
        if segment.kind != elf64::PT_NOTE {
            continue;
        }
        let mut notes = Vec::new();
        file.seek(SeekFrom::Start(segment.file_offset))?;
        (&mut *file).take(segment.file_size.min(MAX_NOTE_SEGMENT)).read_to_end(&mut notes)?;
        if elf64::notes(&notes).any(|note| note.name == elf64::XEN_NOTE_NAME && note.kind == elf64::XEN_ELFNOTE_PHYS32_ENTRY) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
pub(crate) mod test_images {
    //! Minimal kernel images: just the headers `inspect_kernel` reads.

    /// An ELF64 header for `machine`, optionally with one PT_NOTE segment holding the PVH note.
    pub fn elf64(machine: u16, with_pvh_note: bool) -> Vec<u8> {
        let mut image = vec![0u8; 64];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2;
        image[5] = 1;
        image[0x12..0x14].copy_from_slice(&machine.to_le_bytes());
        if with_pvh_note {
            // One program header right after the ELF header, the note right after that.
            image[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
            image[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
            image[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
            let mut note = Vec::new();
            note.extend_from_slice(&4u32.to_le_bytes());
            note.extend_from_slice(&4u32.to_le_bytes());
            note.extend_from_slice(&18u32.to_le_bytes());
            note.extend_from_slice(b"Xen\0");
            note.extend_from_slice(&0x10_0000u32.to_le_bytes());
            let mut program_header = vec![0u8; 56];
            program_header[..4].copy_from_slice(&4u32.to_le_bytes());
            program_header[8..16].copy_from_slice(&(64u64 + 56).to_le_bytes());
            program_header[32..40].copy_from_slice(&(note.len() as u64).to_le_bytes());
            image.extend_from_slice(&program_header);
            image.extend_from_slice(&note);
        }
        image
    }

    /// A bzImage setup header with the given boot protocol version and xloadflags.
    pub fn bzimage(version: u16, xloadflags: u16) -> Vec<u8> {
        let mut image = vec![0u8; 0x400];
        image[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&version.to_le_bytes());
        image[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
        image
    }
}

#[cfg(test)]
mod tests {
    use super::test_images::*;
    use super::*;
    use crate::test_support::TempDir;

    fn inspect(bytes: &[u8]) -> Result<KernelImage, String> {
        let dir = TempDir::new();
        inspect_kernel(&dir.write("kernel", bytes))
    }

    #[test]
    fn recognises_elf64_with_and_without_pvh_note() {
        assert_eq!(inspect(&elf64(62, true)), Ok(KernelImage::Elf64 { has_pvh_note: true }));
        assert_eq!(inspect(&elf64(62, false)), Ok(KernelImage::Elf64 { has_pvh_note: false }));
    }

    #[test]
    fn refuses_other_elves() {
        assert!(inspect(&elf64(183, false)).unwrap_err().contains("machine 183, not x86-64"));
        let mut elf32 = elf64(62, false);
        elf32[4] = 1;
        assert!(inspect(&elf32).unwrap_err().contains("32-bit ELF"));
        assert!(inspect(b"\x7fELF\x02").unwrap_err().contains("truncated"));
    }

    #[test]
    fn recognises_64_bit_bzimages_only() {
        assert_eq!(inspect(&bzimage(0x020f, 1)), Ok(KernelImage::BzImage));
        assert!(inspect(&bzimage(0x020f, 0)).unwrap_err().contains("without a 64-bit entry point"));
        assert!(inspect(&bzimage(0x0208, 1)).unwrap_err().contains("predates the 64-bit entry flag"));
        assert!(inspect(&bzimage(0x0204, 1)).unwrap_err().contains("at least 2.06"));
    }

    #[test]
    fn refuses_unknown_and_unreadable_files() {
        assert!(inspect(b"#!/bin/sh\n").unwrap_err().contains("neither an ELF64 x86-64 kernel nor a bzImage"));
        assert!(inspect_kernel(Path::new("/nonexistent/kernel")).unwrap_err().contains("cannot open"));
        let dir = TempDir::new();
        assert!(inspect_kernel(dir.path()).unwrap_err().contains("is a directory"));
    }

    #[test]
    fn probing_finds_at_least_the_cpu_we_run_on() {
        assert!(!HostFacts::probe().usable_cpus.is_empty());
    }
}
