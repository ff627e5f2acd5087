//! The parts of ELF64 that clowder reads, as pure functions over bytes (no_std, no allocation,
//! no I/O): the file header and program headers of x86-64 executables and kernels, and the notes
//! of a note segment. The lightweight kernel loads jobs with it, the daemon checks a job's binary
//! before it boots an enclave, and the VMM inspects kernels; each reads the bytes its own way and
//! words its own errors.
#![no_std]

pub const FILE_HEADER_LEN: usize = 64;
/// An ELF64 program header's size; files may use larger entries (the rest is not read).
pub const PROGRAM_HEADER_LEN: usize = 56;
pub const MAGIC: &[u8; 4] = b"\x7fELF";
pub const CLASS_64: u8 = 2;
pub const LITTLE_ENDIAN: u8 = 1;
pub const ET_EXEC: u16 = 2;
/// A shared object, or a position-independent (static-pie) executable.
pub const ET_DYN: u16 = 3;
pub const EM_X86_64: u16 = 62;
pub const PT_LOAD: u32 = 1;
pub const PT_INTERP: u32 = 3;
pub const PT_NOTE: u32 = 4;
pub const PT_PHDR: u32 = 6;
pub const PF_X: u32 = 1;
pub const PF_W: u32 = 2;
pub const PF_R: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// No ELF magic at the start.
    NotElf,
    /// The magic, but fewer bytes than a file header.
    Truncated,
}

/// The fields of the ELF64 file header that clowder uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub class: u8,
    pub data_encoding: u8,
    pub kind: u16,
    pub machine: u16,
    pub entry: u64,
    pub program_headers_offset: u64,
    pub program_header_size: u16,
    pub program_header_count: u16,
}

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([bytes[offset], bytes[offset + 1], bytes[offset + 2], bytes[offset + 3]])
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from(u32_at(bytes, offset)) | u64::from(u32_at(bytes, offset + 4)) << 32
}

impl FileHeader {
    /// The header at the start of `bytes` (read as little-endian ELF64; check `is_x86_64`).
    pub fn parse(bytes: &[u8]) -> Result<FileHeader, HeaderError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(HeaderError::NotElf);
        }
        if bytes.len() < FILE_HEADER_LEN {
            return Err(HeaderError::Truncated);
        }
        Ok(FileHeader {
            class: bytes[4],
            data_encoding: bytes[5],
            kind: u16_at(bytes, 16),
            machine: u16_at(bytes, 18),
            entry: u64_at(bytes, 24),
            program_headers_offset: u64_at(bytes, 32),
            program_header_size: u16_at(bytes, 54),
            program_header_count: u16_at(bytes, 56),
        })
    }

    /// ELF64, little-endian, for x86-64.
    pub fn is_x86_64(&self) -> bool {
        self.class == CLASS_64 && self.data_encoding == LITTLE_ENDIAN && self.machine == EM_X86_64
    }

    /// An x86-64 program a loader can start: a fixed-address or position-independent executable.
    pub fn is_x86_64_executable(&self) -> bool {
        self.is_x86_64() && matches!(self.kind, ET_EXEC | ET_DYN)
    }

    /// The program header table's entries are ELF64 program headers (large enough to read).
    pub fn has_readable_program_headers(&self) -> bool {
        usize::from(self.program_header_size) >= PROGRAM_HEADER_LEN
    }

    /// The program header table's size in bytes.
    pub fn program_header_table_len(&self) -> u64 {
        u64::from(self.program_header_size) * u64::from(self.program_header_count)
    }

    /// Where entry `index` of the program header table lies in the file; `None` past the
    /// address space (a corrupt offset).
    pub fn program_header_offset(&self, index: u16) -> Option<u64> {
        self.program_headers_offset.checked_add(u64::from(index) * u64::from(self.program_header_size))
    }
}

/// The fields of an ELF64 program header that clowder uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramHeader {
    pub kind: u32,
    pub flags: u32,
    pub file_offset: u64,
    pub address: u64,
    pub file_size: u64,
    pub memory_size: u64,
}

impl ProgramHeader {
    /// The entry at the start of `bytes`; `None` if shorter than an ELF64 program header.
    pub fn parse(bytes: &[u8]) -> Option<ProgramHeader> {
        if bytes.len() < PROGRAM_HEADER_LEN {
            return None;
        }
        Some(ProgramHeader {
            kind: u32_at(bytes, 0),
            flags: u32_at(bytes, 4),
            file_offset: u64_at(bytes, 8),
            address: u64_at(bytes, 16),
            file_size: u64_at(bytes, 32),
            memory_size: u64_at(bytes, 40),
        })
    }

    /// The segment's bytes within `file` (the whole file's bytes); `None` if they lie past its end.
    pub fn file_bytes<'a>(&self, file: &'a [u8]) -> Option<&'a [u8]> {
        let start = usize::try_from(self.file_offset).ok()?;
        let end = start.checked_add(usize::try_from(self.file_size).ok()?)?;
        file.get(start..end)
    }
}

/// One note of a note segment (`PT_NOTE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note<'a> {
    /// The owner's name with its terminating NUL, as stored (`b"Xen\0"`).
    pub name: &'a [u8],
    pub kind: u32,
    pub descriptor: &'a [u8],
}

/// The notes in a note segment's bytes, in order; iteration stops at the first note that does not
/// fit in what is left.
pub fn notes(segment: &[u8]) -> Notes<'_> {
    Notes { rest: segment }
}

pub struct Notes<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Notes<'a> {
    type Item = Note<'a>;

    fn next(&mut self) -> Option<Note<'a>> {
        const NOTE_HEADER_LEN: usize = 12;
        let padded = |length: usize| length.checked_next_multiple_of(4);
        if self.rest.len() < NOTE_HEADER_LEN {
            return None;
        }
        let name_size = u32_at(self.rest, 0) as usize;
        let descriptor_size = u32_at(self.rest, 4) as usize;
        let kind = u32_at(self.rest, 8);
        let descriptor_at = NOTE_HEADER_LEN.checked_add(padded(name_size)?)?;
        let next = descriptor_at.checked_add(padded(descriptor_size)?)?;
        if next > self.rest.len() {
            self.rest = &[];
            return None;
        }
        let note = Note {
            name: &self.rest[NOTE_HEADER_LEN..NOTE_HEADER_LEN + name_size],
            kind,
            descriptor: &self.rest[descriptor_at..descriptor_at + descriptor_size],
        };
        self.rest = &self.rest[next..];
        Some(note)
    }
}

/// The Xen owner name of the notes PVH kernels carry.
pub const XEN_NOTE_NAME: &[u8] = b"Xen\0";
/// `XEN_ELFNOTE_GUEST_OS`: the guest OS's name ("linux").
pub const XEN_ELFNOTE_GUEST_OS: u32 = 6;
/// `XEN_ELFNOTE_PHYS32_ENTRY`: the 32-bit PVH entry point.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, machine: u16, kind: u16) -> [u8; FILE_HEADER_LEN] {
        let mut bytes = [0u8; FILE_HEADER_LEN];
        bytes[..4].copy_from_slice(MAGIC);
        bytes[4] = class;
        bytes[5] = LITTLE_ENDIAN;
        bytes[16..18].copy_from_slice(&kind.to_le_bytes());
        bytes[18..20].copy_from_slice(&machine.to_le_bytes());
        bytes[24..32].copy_from_slice(&0x40_1000u64.to_le_bytes());
        bytes[32..40].copy_from_slice(&64u64.to_le_bytes());
        bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
        bytes[56..58].copy_from_slice(&3u16.to_le_bytes());
        bytes
    }

    #[test]
    fn reads_the_file_header_fields() {
        let parsed = FileHeader::parse(&header(CLASS_64, EM_X86_64, ET_EXEC)).unwrap();
        assert_eq!(parsed.entry, 0x40_1000);
        assert_eq!((parsed.program_headers_offset, parsed.program_header_size, parsed.program_header_count), (64, 56, 3));
        assert!(parsed.is_x86_64_executable() && parsed.has_readable_program_headers());
        assert_eq!(parsed.program_header_table_len(), 168);
        assert_eq!(parsed.program_header_offset(2), Some(64 + 112));
    }

    #[test]
    fn tells_other_files_and_machines_apart() {
        assert_eq!(FileHeader::parse(b"#!/bin/sh\n"), Err(HeaderError::NotElf));
        assert_eq!(FileHeader::parse(b""), Err(HeaderError::NotElf));
        assert_eq!(FileHeader::parse(&header(CLASS_64, EM_X86_64, ET_EXEC)[..40]), Err(HeaderError::Truncated));
        assert!(!FileHeader::parse(&header(1, EM_X86_64, ET_EXEC)).unwrap().is_x86_64());
        assert!(!FileHeader::parse(&header(CLASS_64, 183, ET_EXEC)).unwrap().is_x86_64());
        let object = FileHeader::parse(&header(CLASS_64, EM_X86_64, 1)).unwrap();
        assert!(object.is_x86_64() && !object.is_x86_64_executable());
    }

    #[test]
    fn a_corrupt_table_offset_does_not_overflow() {
        let mut bytes = header(CLASS_64, EM_X86_64, ET_EXEC);
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(FileHeader::parse(&bytes).unwrap().program_header_offset(1), None);
    }

    #[test]
    fn program_headers_and_their_bytes() {
        let mut entry = [0u8; PROGRAM_HEADER_LEN];
        entry[..4].copy_from_slice(&PT_LOAD.to_le_bytes());
        entry[4..8].copy_from_slice(&(PF_R | PF_X).to_le_bytes());
        entry[8..16].copy_from_slice(&2u64.to_le_bytes());
        entry[16..24].copy_from_slice(&0x40_0000u64.to_le_bytes());
        entry[32..40].copy_from_slice(&3u64.to_le_bytes());
        entry[40..48].copy_from_slice(&0x1000u64.to_le_bytes());
        let parsed = ProgramHeader::parse(&entry).unwrap();
        assert_eq!((parsed.kind, parsed.flags, parsed.address, parsed.memory_size), (PT_LOAD, 5, 0x40_0000, 0x1000));
        assert_eq!(parsed.file_bytes(b"abcdef"), Some(&b"cde"[..]));
        assert_eq!(parsed.file_bytes(b"abcd"), None);
        assert_eq!(ProgramHeader::parse(&entry[..55]), None);
    }

    fn note(name: &[u8], kind: u32, descriptor: &[u8]) -> [u8; 32] {
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&(name.len() as u32).to_le_bytes());
        bytes[4..8].copy_from_slice(&(descriptor.len() as u32).to_le_bytes());
        bytes[8..12].copy_from_slice(&kind.to_le_bytes());
        bytes[12..12 + name.len()].copy_from_slice(name);
        let at = 12 + name.len().next_multiple_of(4);
        bytes[at..at + descriptor.len()].copy_from_slice(descriptor);
        bytes
    }

    /// Untrusted input: any bytes, and any corruption of a well-formed image, are read without
    /// a panic or a read outside them (the kernel parses what a user hands it).
    #[test]
    fn random_and_corrupted_images_never_panic() {
        let mut image = [0u8; 512];
        image[..FILE_HEADER_LEN].copy_from_slice(&header(CLASS_64, EM_X86_64, ET_EXEC));
        image[64..68].copy_from_slice(&PT_NOTE.to_le_bytes());
        image[72..80].copy_from_slice(&232u64.to_le_bytes());
        image[96..104].copy_from_slice(&64u64.to_le_bytes());
        image[232..264].copy_from_slice(&note(XEN_NOTE_NAME, XEN_ELFNOTE_PHYS32_ENTRY, &[1, 2, 3, 4]));
        let mut rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
        let mut random = move || rng.u64(..);
        for round in 0..20_000 {
            let mut bytes = image;
            if round % 2 == 0 {
                for _ in 0..1 + random() % 8 {
                    let at = (random() % bytes.len() as u64) as usize;
                    bytes[at] = random() as u8;
                }
            } else {
                bytes.iter_mut().for_each(|byte| *byte = random() as u8);
                bytes[..4].copy_from_slice(MAGIC);
            }
            let length = (random() % (bytes.len() as u64 + 1)) as usize;
            let bytes = &bytes[..length];
            let Ok(parsed) = FileHeader::parse(bytes) else { continue };
            let _ = (parsed.is_x86_64_executable(), parsed.program_header_table_len());
            for index in 0..parsed.program_header_count.min(64) {
                let entry = parsed.program_header_offset(index).and_then(|at| bytes.get(usize::try_from(at).ok()?..));
                if let Some(segment) = entry.and_then(ProgramHeader::parse) {
                    if let Some(content) = segment.file_bytes(bytes) {
                        notes(content).for_each(|found| assert!(found.name.len() + found.descriptor.len() <= content.len()));
                    }
                }
            }
        }
    }

    #[test]
    fn notes_are_read_in_order_and_a_cut_one_ends_them() {
        let mut segment = [0u8; 64];
        segment[..32].copy_from_slice(&note(XEN_NOTE_NAME, XEN_ELFNOTE_GUEST_OS, b"linux\0"));
        segment[32..].copy_from_slice(&note(b"GNU\0", 3, &[7; 16]));
        // The first note is 12 + 4 + 8 = 24 bytes; the second starts at 32: pad the first out.
        segment[4..8].copy_from_slice(&14u32.to_le_bytes());
        let found: [_; 2] = {
            let mut all = notes(&segment);
            [all.next().unwrap(), all.next().unwrap()]
        };
        assert_eq!((found[0].name, found[0].kind, &found[0].descriptor[..6]), (XEN_NOTE_NAME, 6, &b"linux\0"[..]));
        assert_eq!((found[1].name, found[1].kind, found[1].descriptor), (&b"GNU\0"[..], 3, &[7u8; 16][..]));
        assert_eq!(notes(&segment[..40]).count(), 1);
        let mut huge = note(XEN_NOTE_NAME, 18, &[]);
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(notes(&huge).count(), 0);
    }
}
