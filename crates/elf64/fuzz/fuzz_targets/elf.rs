//! Arbitrary files through every use of `elf64` on a binary nobody vouches for: the crate's own
//! entry points (file header, program header table, segment bytes, notes, as the VMM walks a
//! kernel's notes) and the lightweight kernel's loader (`kernels/lwk/src/job/elf.rs`, compiled
//! here for the host: it is pure code over bytes). Nothing may panic or read outside the file,
//! and what the LWK accepts must be safe to load: every segment's bytes inside the file, no
//! larger in the file than in memory, and inside user space.
#![no_main]

extern crate alloc;

use elf64::{notes, FileHeader, ProgramHeader};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code, unused_imports)] // the kernel's error texts and flag re-exports, unused here
#[path = "../../../../kernels/lwk/src/job/elf.rs"]
mod lwk_elf;

/// Where user space ends for the LWK (47-bit virtual addresses).
const USER_SPACE_END: u64 = 1 << 47;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = FileHeader::parse(data) {
        let _ = (header.is_x86_64_executable(), header.has_readable_program_headers(), header.program_header_table_len());
        // Entries of size 0 all lie at one place: reading it once is reading them all.
        let count = if header.program_header_size == 0 { header.program_header_count.min(1) } else { header.program_header_count };
        for index in 0..count {
            let entry = header.program_header_offset(index).and_then(|at| data.get(usize::try_from(at).ok()?..));
            // Later entries lie further on: the first one past the end ends the table.
            let Some(segment) = entry.and_then(ProgramHeader::parse) else { break };
            if let Some(content) = segment.file_bytes(data) {
                assert_eq!(content.len() as u64, segment.file_size);
                for note in notes(content) {
                    assert!(note.name.len() + note.descriptor.len() <= content.len());
                }
            }
        }
    }
    if let Ok(executable) = lwk_elf::Executable::parse(data) {
        assert!(!executable.segments.is_empty());
        for segment in &executable.segments {
            assert!(segment.file_bytes(data).is_some(), "a loaded segment's bytes lie past the file");
            assert!(segment.file_size <= segment.memory_size);
            assert!(segment.address.checked_add(segment.memory_size).is_some_and(|end| end <= USER_SPACE_END));
        }
    }
});
