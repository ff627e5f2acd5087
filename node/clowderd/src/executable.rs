//! What the daemon checks in a job's binary before it boots an enclave or sends the job: an
//! LWK runs static x86-64 Linux executables, and a program it cannot run should be refused
//! here with a sentence that says why, not by the kernel after the enclave started. The
//! kernel checks again (it trusts nobody); this is for the user.

use std::fs::File;
use std::os::unix::fs::FileExt;

use elf64::{FileHeader, ProgramHeader, FILE_HEADER_LEN, PT_INTERP, PT_LOAD};

/// A larger program header table is a corrupt file (real ones are a few hundred bytes).
const MAX_PROGRAM_HEADER_TABLE: u64 = 1 << 20;
/// Longer interpreter paths are cut in the message.
const MAX_INTERPRETER_SHOWN: u64 = 256;

/// Why `binary` cannot run in an LWK enclave, as the end of a sentence about the program
/// ("is dynamically linked ..."); `None` if it looks runnable.
pub fn unrunnable(binary: &File) -> Option<String> {
    let read = |offset: u64, len: u64| -> Option<Vec<u8>> {
        let mut bytes = vec![0; len as usize];
        binary.read_exact_at(&mut bytes, offset).ok()?;
        Some(bytes)
    };
    let Some(header) = read(0, FILE_HEADER_LEN as u64) else {
        return Some(not_elf());
    };
    let header = match program_header_table(&header) {
        Ok(header) => header,
        Err(problem) => return Some(problem.to_string()),
    };
    let Some(table) = read(header.program_headers_offset, header.program_header_table_len()) else {
        return Some("is cut short: its program headers lie past its end".into());
    };
    match check_program_headers(&table, header.program_header_size) {
        Ok(()) => None,
        Err(Problem::Interpreter { offset, len }) => {
            let path = read(offset, len.min(MAX_INTERPRETER_SHOWN)).map(|bytes| {
                let path = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
                String::from_utf8_lossy(path).into_owned()
            });
            Some(dynamically_linked(path.as_deref()))
        }
        Err(problem) => Some(problem.to_string()),
    }
}

fn not_elf() -> String {
    "is not an ELF executable (enclaves run static x86-64 Linux executables)".into()
}

fn dynamically_linked(interpreter: Option<&str>) -> String {
    let asks = interpreter.filter(|path| !path.is_empty()).map(|path| format!(" (it asks for {path})")).unwrap_or_default();
    format!("is dynamically linked{asks}: enclaves run static executables; link it with -static")
}

#[derive(Debug, PartialEq, Eq)]
enum Problem {
    NotElf,
    NotX86_64Executable,
    MalformedProgramHeaders,
    /// A PT_INTERP segment: the interpreter's path lies at `offset`, `len` bytes.
    Interpreter {
        offset: u64,
        len: u64,
    },
    NothingToLoad,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NotElf => f.write_str(&not_elf()),
            Problem::NotX86_64Executable => f.write_str("is not a 64-bit little-endian x86-64 executable"),
            Problem::MalformedProgramHeaders => f.write_str("has a malformed program header table"),
            Problem::Interpreter { .. } => f.write_str(&dynamically_linked(None)),
            Problem::NothingToLoad => f.write_str("has no loadable segment"),
        }
    }
}

/// The ELF header, if it describes an x86-64 executable whose program header table can be read.
fn program_header_table(header: &[u8]) -> Result<FileHeader, Problem> {
    let header = FileHeader::parse(header).map_err(|_| Problem::NotElf)?;
    if !header.is_x86_64_executable() {
        return Err(Problem::NotX86_64Executable);
    }
    if !header.has_readable_program_headers() || header.program_header_table_len() > MAX_PROGRAM_HEADER_TABLE {
        return Err(Problem::MalformedProgramHeaders);
    }
    Ok(header)
}

/// The program header table (entries of `entry_size` bytes): an interpreter (dynamic
/// linking), no loadable segment, or fine.
fn check_program_headers(table: &[u8], entry_size: u16) -> Result<(), Problem> {
    let mut loadable = false;
    for entry in table.chunks_exact(usize::from(entry_size)).filter_map(ProgramHeader::parse) {
        match entry.kind {
            PT_INTERP => return Err(Problem::Interpreter { offset: entry.file_offset, len: entry.file_size }),
            PT_LOAD => loadable = true,
            _ => {}
        }
    }
    if loadable {
        Ok(())
    } else {
        Err(Problem::NothingToLoad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elf64::{EM_X86_64, ET_DYN, ET_EXEC, PROGRAM_HEADER_LEN};
    use std::io::Write;

    /// An x86-64 ELF executable of type `kind` whose program headers (right after the ELF
    /// header) have the given types; a PT_INTERP names `interpreter`, placed after them.
    fn elf(kind: u16, segments: &[u32], interpreter: &str) -> Vec<u8> {
        let mut bytes = vec![0u8; FILE_HEADER_LEN];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2;
        bytes[5] = 1;
        bytes[16..18].copy_from_slice(&kind.to_le_bytes());
        bytes[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        bytes[32..40].copy_from_slice(&(FILE_HEADER_LEN as u64).to_le_bytes());
        bytes[54..56].copy_from_slice(&(PROGRAM_HEADER_LEN as u16).to_le_bytes());
        bytes[56..58].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        let interpreter_at = (FILE_HEADER_LEN + segments.len() * PROGRAM_HEADER_LEN) as u64;
        for &kind in segments {
            let mut entry = [0u8; PROGRAM_HEADER_LEN];
            entry[..4].copy_from_slice(&kind.to_le_bytes());
            entry[8..16].copy_from_slice(&interpreter_at.to_le_bytes());
            entry[32..40].copy_from_slice(&(interpreter.len() as u64 + 1).to_le_bytes());
            bytes.extend_from_slice(&entry);
        }
        bytes.extend_from_slice(interpreter.as_bytes());
        bytes.push(0);
        bytes
    }

    fn verdict(bytes: &[u8]) -> Option<String> {
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let file = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("clowderd-executable-{}-{file}", std::process::id()));
        File::create(&path).unwrap().write_all(bytes).unwrap();
        let verdict = unrunnable(&File::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        verdict
    }

    #[test]
    fn static_executables_pass_and_static_pie_too() {
        assert_eq!(verdict(&elf(ET_EXEC, &[6, PT_LOAD, PT_LOAD], "")), None);
        assert_eq!(verdict(&elf(ET_DYN, &[PT_LOAD], "")), None);
    }

    #[test]
    fn a_dynamically_linked_program_is_refused_with_its_interpreter_named() {
        let problem = verdict(&elf(ET_DYN, &[6, PT_INTERP, PT_LOAD], "/lib64/ld-linux-x86-64.so.2")).unwrap();
        assert_eq!(
            problem,
            "is dynamically linked (it asks for /lib64/ld-linux-x86-64.so.2): enclaves run static executables; link it with -static"
        );
        // The daemon's own test binary is dynamically linked, as Rust programs are by default.
        let own = unrunnable(&File::open(std::env::current_exe().unwrap()).unwrap()).unwrap();
        assert!(own.starts_with("is dynamically linked (it asks for /"), "{own}");
    }

    #[test]
    fn other_files_are_refused_with_what_is_wrong() {
        assert_eq!(verdict(b"#!/bin/sh\necho hello\n").unwrap(), not_elf());
        assert_eq!(verdict(b"").unwrap(), not_elf());
        let mut thirty_two_bit = elf(ET_EXEC, &[PT_LOAD], "");
        thirty_two_bit[4] = 1;
        assert_eq!(verdict(&thirty_two_bit).unwrap(), "is not a 64-bit little-endian x86-64 executable");
        let mut object = elf(ET_EXEC, &[PT_LOAD], "");
        object[16] = 1; // ET_REL
        assert_eq!(verdict(&object).unwrap(), "is not a 64-bit little-endian x86-64 executable");
        assert_eq!(verdict(&elf(ET_EXEC, &[6], "")).unwrap(), "has no loadable segment");
        let mut short_entries = elf(ET_EXEC, &[PT_LOAD], "");
        short_entries[54] = 32;
        assert_eq!(verdict(&short_entries).unwrap(), "has a malformed program header table");
        let mut cut = elf(ET_EXEC, &[PT_LOAD, PT_LOAD], "");
        cut.truncate(FILE_HEADER_LEN + 10);
        assert_eq!(verdict(&cut).unwrap(), "is cut short: its program headers lie past its end");
    }
}
