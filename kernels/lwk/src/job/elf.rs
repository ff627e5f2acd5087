//! Reading a static x86-64 ELF executable: header and program headers (the `elf64` crate), and
//! what this kernel requires of them.

use alloc::vec::Vec;
use elf64::{FileHeader, HeaderError, ProgramHeader, PT_INTERP, PT_LOAD, PT_PHDR};

pub use elf64::{PF_R, PF_W, PF_X};

/// Where a position-independent (static-pie) executable is placed: 2 MiB aligned, in the
/// area Linux uses for PIEs.
const PIE_LOAD_BIAS: u64 = 0x5555_5540_0000;

/// Where user space ends (47-bit virtual addresses).
const USER_SPACE_END: u64 = 1 << 47;

/// A loadable segment; its address already relocated by the load bias.
pub type Segment = ProgramHeader;

pub struct Executable {
    pub entry: u64,
    /// The program headers' address once loaded (AT_PHDR), their entry size (AT_PHENT) and
    /// number (AT_PHNUM).
    pub program_headers_address: u64,
    pub program_header_size: u64,
    pub program_header_count: u64,
    pub segments: Vec<Segment>,
}

#[derive(Debug)]
pub enum ElfError {
    NotElf,
    NotX86_64Executable,
    DynamicallyLinked,
    Truncated,
    NoLoadableSegment,
    MalformedLoadableSegment,
}

/// The end of a sentence about the program ("the program is dynamically linked ...").
impl core::fmt::Display for ElfError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ElfError::NotElf => "is not an ELF executable",
            ElfError::NotX86_64Executable => "is not a 64-bit x86-64 executable",
            ElfError::DynamicallyLinked => "is dynamically linked: this kernel runs static executables (link with -static)",
            ElfError::Truncated => "is cut short (a header or segment lies past its end)",
            ElfError::NoLoadableSegment => "has no loadable segment",
            ElfError::MalformedLoadableSegment => "has a malformed loadable segment (outside a process's address space, or larger in the file than in memory)",
        })
    }
}

impl Executable {
    pub fn parse(image: &[u8]) -> Result<Executable, ElfError> {
        let header = FileHeader::parse(image).map_err(|error| match error {
            HeaderError::NotElf | HeaderError::Truncated => ElfError::NotElf,
        })?;
        if !header.is_x86_64_executable() {
            return Err(ElfError::NotX86_64Executable);
        }
        if !header.has_readable_program_headers() {
            return Err(ElfError::Truncated);
        }
        let bias = if header.kind == elf64::ET_DYN { PIE_LOAD_BIAS } else { 0 };

        let mut segments = Vec::new();
        let mut program_headers_address = None;
        for index in 0..header.program_header_count {
            let entry = header
                .program_header_offset(index)
                .and_then(|offset| image.get(usize::try_from(offset).ok()?..))
                .and_then(ProgramHeader::parse)
                .ok_or(ElfError::Truncated)?;
            let segment = Segment { address: entry.address.saturating_add(bias), ..entry };
            match segment.kind {
                PT_INTERP => return Err(ElfError::DynamicallyLinked),
                PT_PHDR => program_headers_address = Some(segment.address),
                PT_LOAD => {
                    entry.file_bytes(image).ok_or(ElfError::Truncated)?;
                    if segment.address.checked_add(segment.memory_size).is_none_or(|end| end > USER_SPACE_END)
                        || segment.file_size > segment.memory_size
                    {
                        return Err(ElfError::MalformedLoadableSegment);
                    }
                    segments.push(segment);
                }
                _ => {}
            }
        }
        if segments.is_empty() {
            return Err(ElfError::NoLoadableSegment);
        }
        // Without PT_PHDR, the headers are where the segment that maps file offset 0 puts them.
        let table_offset = header.program_headers_offset;
        let program_headers_address = program_headers_address
            .or_else(|| {
                segments
                    .iter()
                    .find(|segment| segment.file_offset == 0 && segment.file_size > table_offset)
                    .map(|segment| segment.address + table_offset)
            })
            .unwrap_or(0);
        Ok(Executable {
            entry: header.entry.wrapping_add(bias),
            program_headers_address,
            program_header_size: u64::from(header.program_header_size),
            program_header_count: u64::from(header.program_header_count),
            segments,
        })
    }
}
