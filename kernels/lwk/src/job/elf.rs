//! Reading a static x86-64 ELF executable: header and program headers.

use alloc::vec::Vec;

pub const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;
const PT_PHDR: u32 = 6;
pub const PF_X: u32 = 1;
pub const PF_W: u32 = 2;
pub const PF_R: u32 = 4;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
pub const PROGRAM_HEADER_SIZE: u64 = 56;

/// Where a position-independent (static-pie) executable is placed: 2 MiB aligned, in the
/// area Linux uses for PIEs.
const PIE_LOAD_BIAS: u64 = 0x5555_5540_0000;

#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub kind: u32,
    pub flags: u32,
    pub file_offset: u64,
    /// Already relocated by the load bias.
    pub address: u64,
    pub file_size: u64,
    pub memory_size: u64,
}

pub struct Executable {
    pub entry: u64,
    /// The program headers' address once loaded (AT_PHDR), and their number.
    pub program_headers_address: u64,
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
        })
    }
}

fn read_u16(bytes: &[u8], offset: u64) -> Result<u16, ElfError> {
    let offset = offset as usize;
    let field = bytes.get(offset..offset + 2).ok_or(ElfError::Truncated)?;
    Ok(u16::from_le_bytes([field[0], field[1]]))
}

fn read_u32(bytes: &[u8], offset: u64) -> Result<u32, ElfError> {
    let offset = offset as usize;
    let field = bytes.get(offset..offset + 4).ok_or(ElfError::Truncated)?;
    Ok(u32::from_le_bytes(field.try_into().unwrap()))
}

fn read_u64(bytes: &[u8], offset: u64) -> Result<u64, ElfError> {
    let offset = offset as usize;
    let field = bytes.get(offset..offset + 8).ok_or(ElfError::Truncated)?;
    Ok(u64::from_le_bytes(field.try_into().unwrap()))
}

impl Executable {
    pub fn parse(image: &[u8]) -> Result<Executable, ElfError> {
        if image.len() < 64 || &image[..4] != b"\x7fELF" {
            return Err(ElfError::NotElf);
        }
        let (class, data) = (image[4], image[5]);
        let kind = read_u16(image, 16)?;
        if class != 2 || data != 1 || read_u16(image, 18)? != EM_X86_64 || !matches!(kind, ET_EXEC | ET_DYN) {
            return Err(ElfError::NotX86_64Executable);
        }
        let bias = if kind == ET_DYN { PIE_LOAD_BIAS } else { 0 };
        let program_headers_offset = read_u64(image, 32)?;
        let entry_size = read_u16(image, 54)? as u64;
        let count = read_u16(image, 56)? as u64;
        if entry_size < PROGRAM_HEADER_SIZE {
            return Err(ElfError::Truncated);
        }

        let mut segments = Vec::new();
        let mut program_headers_address = None;
        for i in 0..count {
            let header = program_headers_offset + i * entry_size;
            let segment = Segment {
                kind: read_u32(image, header)?,
                flags: read_u32(image, header + 4)?,
                file_offset: read_u64(image, header + 8)?,
                address: read_u64(image, header + 16)? + bias,
                file_size: read_u64(image, header + 32)?,
                memory_size: read_u64(image, header + 40)?,
            };
            match segment.kind {
                PT_INTERP => return Err(ElfError::DynamicallyLinked),
                PT_PHDR => program_headers_address = Some(segment.address),
                PT_LOAD => {
                    if segment.file_offset.checked_add(segment.file_size).is_none_or(|end| end > image.len() as u64) {
                        return Err(ElfError::Truncated);
                    }
                    segments.push(segment);
                }
                _ => {}
            }
        }
        // Without PT_PHDR, the headers are where the segment that maps file offset 0 puts them.
        let program_headers_address = program_headers_address
            .or_else(|| {
                segments
                    .iter()
                    .find(|segment| segment.file_offset == 0 && segment.file_size > program_headers_offset)
                    .map(|segment| segment.address + program_headers_offset)
            })
            .unwrap_or(0);
        if segments.is_empty() {
            return Err(ElfError::NoLoadableSegment);
        }
        Ok(Executable { entry: read_u64(image, 24)? + bias, program_headers_address, program_header_count: count, segments })
    }
}
