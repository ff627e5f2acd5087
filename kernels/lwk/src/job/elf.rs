//! Reading an x86-64 ELF executable and its interpreter (the dynamic linker): header and
//! program headers (the `elf64` crate), and what this kernel requires of them.

use alloc::string::String;
use alloc::vec::Vec;
use elf64::{FileHeader, HeaderError, ProgramHeader, PT_INTERP, PT_LOAD, PT_PHDR};

pub use elf64::{PF_R, PF_W, PF_X};

/// Where a position-independent executable is placed: 2 MiB aligned, in the area Linux uses
/// for PIEs.
const PIE_LOAD_BIAS: u64 = 0x5555_5540_0000;

/// Where user space ends (47-bit virtual addresses).
const USER_SPACE_END: u64 = 1 << 47;

/// The largest segment alignment honoured when placing an interpreter (larger ones, which
/// `-z max-page-size` can ask for, still get 2 MiB).
const MAX_ALIGNMENT: u64 = 2 << 20;

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
    /// PT_INTERP: the path of the ELF interpreter that runs the program (a dynamically linked
    /// one), if it names one.
    pub interpreter: Option<String>,
    /// Position independent (ET_DYN): it may be placed anywhere, aligned to `alignment`.
    pub relocatable: bool,
    /// The loadable segments' largest alignment (p_align), at least a page.
    pub alignment: u64,
}

#[derive(Debug)]
pub enum ElfError {
    NotElf,
    NotX86_64Executable,
    Truncated,
    NoLoadableSegment,
    MalformedLoadableSegment,
    MalformedInterpreterPath,
    /// An interpreter that names an interpreter of its own (Linux refuses it too).
    InterpreterNeedsInterpreter,
}

/// The end of a sentence about the file ("the program is not an ELF executable").
impl core::fmt::Display for ElfError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ElfError::NotElf => "is not an ELF executable",
            ElfError::NotX86_64Executable => "is not a 64-bit x86-64 executable",
            ElfError::Truncated => "is cut short (a header or segment lies past its end)",
            ElfError::NoLoadableSegment => "has no loadable segment",
            ElfError::MalformedLoadableSegment => {
                "has a malformed loadable segment (outside a process's address space, or larger in the file than in memory)"
            }
            ElfError::MalformedInterpreterPath => "names its interpreter with a malformed path (PT_INTERP)",
            ElfError::InterpreterNeedsInterpreter => "is an interpreter that asks for an interpreter of its own",
        })
    }
}

/// p_align of the program header at the start of `entry` (the `elf64` crate does not read it).
fn alignment_of(entry: &[u8]) -> u64 {
    entry.get(48..56).map_or(0, |bytes| u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
}

/// The path a PT_INTERP segment holds: NUL-terminated, one NUL only, valid UTF-8.
fn interpreter_path(bytes: &[u8]) -> Result<String, ElfError> {
    let (last, path) = bytes.split_last().ok_or(ElfError::MalformedInterpreterPath)?;
    if *last != 0 || path.is_empty() || path.contains(&0) {
        return Err(ElfError::MalformedInterpreterPath);
    }
    core::str::from_utf8(path).map(String::from).map_err(|_| ElfError::MalformedInterpreterPath)
}

impl Executable {
    /// The program `image` at its place: a position-independent one at Linux's PIE address.
    pub fn parse(image: &[u8]) -> Result<Executable, ElfError> {
        let executable = Self::parse_unplaced(image)?;
        let bias = if executable.relocatable { PIE_LOAD_BIAS } else { 0 };
        executable.placed_at(bias)
    }

    /// The interpreter `image`, unplaced (`placed_at` puts it beside its program). It must
    /// not ask for an interpreter itself.
    pub fn parse_interpreter(image: &[u8]) -> Result<Executable, ElfError> {
        let interpreter = Self::parse_unplaced(image)?;
        if interpreter.interpreter.is_some() {
            return Err(ElfError::InterpreterNeedsInterpreter);
        }
        Ok(interpreter)
    }

    /// The lowest and (page-rounded) highest address the segments occupy.
    pub fn span(&self) -> (u64, u64) {
        let start = self.segments.iter().map(|s| s.address).min().unwrap_or(0);
        let end = self.segments.iter().map(|s| s.address + s.memory_size).max().unwrap_or(0);
        (start, end.next_multiple_of(4096))
    }

    /// This executable moved up by `bias` (a relocatable one's place); checks that every
    /// segment stays in user space.
    pub fn placed_at(mut self, bias: u64) -> Result<Executable, ElfError> {
        for segment in &mut self.segments {
            segment.address = segment.address.checked_add(bias).ok_or(ElfError::MalformedLoadableSegment)?;
            if segment.address.checked_add(segment.memory_size).is_none_or(|end| end > USER_SPACE_END) {
                return Err(ElfError::MalformedLoadableSegment);
            }
        }
        // Values the job is only told (AT_ENTRY, AT_PHDR): moved as Linux moves them, wrapping, so a
        // file's nonsense PT_PHDR address is passed on rather than overflowing here.
        self.entry = self.entry.wrapping_add(bias);
        if self.program_headers_address != 0 {
            self.program_headers_address = self.program_headers_address.wrapping_add(bias);
        }
        Ok(self)
    }

    fn parse_unplaced(image: &[u8]) -> Result<Executable, ElfError> {
        let header = FileHeader::parse(image).map_err(|error| match error {
            HeaderError::NotElf | HeaderError::Truncated => ElfError::NotElf,
        })?;
        if !header.is_x86_64_executable() {
            return Err(ElfError::NotX86_64Executable);
        }
        if !header.has_readable_program_headers() {
            return Err(ElfError::Truncated);
        }
        let mut segments = Vec::new();
        let mut program_headers_address = None;
        let mut interpreter = None;
        let mut alignment = 4096;
        for index in 0..header.program_header_count {
            let bytes = header.program_header_offset(index).and_then(|offset| image.get(usize::try_from(offset).ok()?..));
            let segment = bytes.and_then(ProgramHeader::parse).ok_or(ElfError::Truncated)?;
            match segment.kind {
                PT_INTERP => interpreter = Some(interpreter_path(segment.file_bytes(image).ok_or(ElfError::Truncated)?)?),
                PT_PHDR => program_headers_address = Some(segment.address),
                PT_LOAD => {
                    segment.file_bytes(image).ok_or(ElfError::Truncated)?;
                    if segment.address.checked_add(segment.memory_size).is_none_or(|end| end > USER_SPACE_END)
                        || segment.file_size > segment.memory_size
                    {
                        return Err(ElfError::MalformedLoadableSegment);
                    }
                    let align = bytes.map_or(0, alignment_of);
                    if align.is_power_of_two() {
                        alignment = alignment.max(align.min(MAX_ALIGNMENT));
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
            entry: header.entry,
            program_headers_address,
            program_header_size: u64::from(header.program_header_size),
            program_header_count: u64::from(header.program_header_count),
            segments,
            interpreter,
            relocatable: header.kind == elf64::ET_DYN,
            alignment,
        })
    }
}
