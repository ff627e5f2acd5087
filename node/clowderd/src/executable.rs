//! What the daemon checks in a job's binary before it boots an enclave or sends the job: an
//! LWK runs x86-64 Linux executables, static ones and dynamically linked ones (their
//! interpreter sent with them, to a persistent enclave, one made for the job if the run names
//! none), and a program it cannot run should be refused here with a sentence that says why,
//! not by the kernel after the enclave started. The kernel checks again (it trusts nobody);
//! this is for the user.

use std::fs::File;
use std::os::unix::fs::FileExt;

use elf64::{FileHeader, ProgramHeader, FILE_HEADER_LEN, PT_INTERP, PT_LOAD};

/// A larger program header table is a corrupt file (real ones are a few hundred bytes).
const MAX_PROGRAM_HEADER_TABLE: u64 = 1 << 20;

/// The longest interpreter path taken (Linux's PATH_MAX).
const MAX_INTERPRETER_PATH: u64 = 4096;

/// What `binary` needs to run in an LWK enclave: `Ok(None)` for a static program,
/// `Ok(Some(path))` for a dynamically linked one whose interpreter (PT_INTERP) is `path`;
/// `Err` says why it cannot run, as the end of a sentence about the program ("is not an ELF
/// executable ...").
pub fn check(binary: &File) -> Result<Option<String>, String> {
    let read = |offset: u64, len: u64| -> Option<Vec<u8>> {
        let mut bytes = vec![0; len as usize];
        binary.read_exact_at(&mut bytes, offset).ok()?;
        Some(bytes)
    };
    let header = read(0, FILE_HEADER_LEN as u64).ok_or_else(not_elf)?;
    let header = program_header_table(&header).map_err(|problem| problem.to_string())?;
    let table = read(header.program_headers_offset, header.program_header_table_len())
        .ok_or_else(|| "is cut short: its program headers lie past its end".to_string())?;
    match check_program_headers(&table, header.program_header_size) {
        Ok(None) => Ok(None),
        Ok(Some((offset, len))) => {
            let bytes = read(offset, len.min(MAX_INTERPRETER_PATH))
                .ok_or_else(|| "is cut short: its interpreter's path lies past its end".to_string())?;
            interpreter_path(&bytes).map(Some)
        }
        Err(problem) => Err(problem.to_string()),
    }
}

/// The path a PT_INTERP segment holds: absolute, NUL-terminated, UTF-8.
fn interpreter_path(bytes: &[u8]) -> Result<String, String> {
    let path = bytes.strip_suffix(&[0]).filter(|path| !path.contains(&0) && path.starts_with(b"/"));
    path.and_then(|path| std::str::from_utf8(path).ok())
        .map(String::from)
        .ok_or_else(|| "names its interpreter with a malformed path (PT_INTERP)".to_string())
}

/// Opens a program's interpreter (its PT_INTERP path) as `owner` would: execve reads it with
/// the caller's rights. The error is as the kernel's (ENOENT for a missing file).
pub fn open_interpreter(path: &str, owner: &crate::hio::Identity) -> std::io::Result<File> {
    let _identity = crate::sys::FsIdentity::assume(owner.uid, owner.gid, &owner.groups)?;
    let file = File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::from_raw_os_error(libc::EACCES));
    }
    Ok(file)
}

fn not_elf() -> String {
    "is not an ELF executable (enclaves run x86-64 Linux executables)".into()
}

#[derive(Debug, PartialEq, Eq)]
enum Problem {
    NotElf,
    NotX86_64Executable,
    MalformedProgramHeaders,
    NothingToLoad,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NotElf => f.write_str(&not_elf()),
            Problem::NotX86_64Executable => f.write_str("is not a 64-bit little-endian x86-64 executable"),
            Problem::MalformedProgramHeaders => f.write_str("has a malformed program header table"),
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

/// The program header table (entries of `entry_size` bytes): where an interpreter's path lies
/// (offset, length) if the program names one (dynamic linking), or no loadable segment.
fn check_program_headers(table: &[u8], entry_size: u16) -> Result<Option<(u64, u64)>, Problem> {
    let mut loadable = false;
    let mut interpreter = None;
    for entry in table.chunks_exact(usize::from(entry_size)).filter_map(ProgramHeader::parse) {
        match entry.kind {
            PT_INTERP => interpreter = Some((entry.file_offset, entry.file_size)),
            PT_LOAD => loadable = true,
            _ => {}
        }
    }
    if loadable {
        Ok(interpreter)
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

    fn verdict(bytes: &[u8]) -> Result<Option<String>, String> {
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let file = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("clowderd-executable-{}-{file}", std::process::id()));
        File::create(&path).unwrap().write_all(bytes).unwrap();
        let verdict = check(&File::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        verdict
    }

    #[test]
    fn static_executables_pass_and_static_pie_too() {
        assert_eq!(verdict(&elf(ET_EXEC, &[6, PT_LOAD, PT_LOAD], "")), Ok(None));
        assert_eq!(verdict(&elf(ET_DYN, &[PT_LOAD], "")), Ok(None));
    }

    #[test]
    fn a_dynamically_linked_program_names_its_interpreter() {
        let interpreter = verdict(&elf(ET_DYN, &[6, PT_INTERP, PT_LOAD], "/lib64/ld-linux-x86-64.so.2"));
        assert_eq!(interpreter, Ok(Some("/lib64/ld-linux-x86-64.so.2".to_string())));
        // The daemon's own test binary is dynamically linked, as Rust programs are by default.
        let own = check(&File::open(std::env::current_exe().unwrap()).unwrap()).unwrap().unwrap();
        assert!(own.starts_with('/'), "{own}");
        let malformed = "names its interpreter with a malformed path (PT_INTERP)";
        assert_eq!(verdict(&elf(ET_DYN, &[PT_INTERP, PT_LOAD], "relative/ld.so")).unwrap_err(), malformed);
        let mut unterminated = elf(ET_DYN, &[PT_INTERP, PT_LOAD], "/lib/ld.so");
        *unterminated.last_mut().unwrap() = b'x';
        assert_eq!(verdict(&unterminated).unwrap_err(), malformed);
    }

    #[test]
    fn other_files_are_refused_with_what_is_wrong() {
        assert_eq!(verdict(b"#!/bin/sh\necho hello\n").unwrap_err(), not_elf());
        assert_eq!(verdict(b"").unwrap_err(), not_elf());
        let mut thirty_two_bit = elf(ET_EXEC, &[PT_LOAD], "");
        thirty_two_bit[4] = 1;
        assert_eq!(verdict(&thirty_two_bit).unwrap_err(), "is not a 64-bit little-endian x86-64 executable");
        let mut object = elf(ET_EXEC, &[PT_LOAD], "");
        object[16] = 1; // ET_REL
        assert_eq!(verdict(&object).unwrap_err(), "is not a 64-bit little-endian x86-64 executable");
        assert_eq!(verdict(&elf(ET_EXEC, &[6], "")).unwrap_err(), "has no loadable segment");
        let mut short_entries = elf(ET_EXEC, &[PT_LOAD], "");
        short_entries[54] = 32;
        assert_eq!(verdict(&short_entries).unwrap_err(), "has a malformed program header table");
        let mut cut = elf(ET_EXEC, &[PT_LOAD, PT_LOAD], "");
        cut.truncate(FILE_HEADER_LEN + 10);
        assert_eq!(verdict(&cut).unwrap_err(), "is cut short: its program headers lie past its end");
    }
}
