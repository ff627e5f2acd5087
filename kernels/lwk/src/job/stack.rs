//! The initial user stack as the System V ABI and Linux lay it out: argc, argv, envp and the
//! auxiliary vector, with the strings and AT_RANDOM bytes above them.

use super::elf::Executable;
use crate::arch::cpu;
use crate::arch::paging::PAGE_SIZE;
use crate::arch::trap::{copy_to_user, copy_words_to_user, UserFault};
use alloc::string::String;
use alloc::vec::Vec;

const AT_NULL: u64 = 0;
const AT_PHDR: u64 = 3;
const AT_PHENT: u64 = 4;
const AT_PHNUM: u64 = 5;
const AT_PAGESZ: u64 = 6;
const AT_BASE: u64 = 7;
const AT_FLAGS: u64 = 8;
const AT_ENTRY: u64 = 9;
const AT_UID: u64 = 11;
const AT_EUID: u64 = 12;
const AT_GID: u64 = 13;
const AT_EGID: u64 = 14;
const AT_PLATFORM: u64 = 15;
const AT_HWCAP: u64 = 16;
const AT_CLKTCK: u64 = 17;
const AT_SECURE: u64 = 23;
const AT_RANDOM: u64 = 25;
const AT_HWCAP2: u64 = 26;
const AT_EXECFN: u64 = 31;
const AT_SYSINFO_EHDR: u64 = 33;

/// Sixteen bytes for AT_RANDOM (libc's stack protector and pointer guard seeds).
pub fn random_bytes() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    for chunk in bytes.chunks_mut(8) {
        let value = cpu::rdrand().unwrap_or_else(|| cpu::read_tsc().wrapping_mul(0x9e37_79b9_7f4a_7c15));
        chunk.copy_from_slice(&value.to_le_bytes()[..chunk.len()]);
    }
    bytes
}

struct StackWriter {
    pointer: u64,
}

impl StackWriter {
    fn push_bytes(&mut self, bytes: &[u8]) -> Result<u64, UserFault> {
        self.pointer -= bytes.len() as u64;
        copy_to_user(self.pointer, bytes)?;
        Ok(self.pointer)
    }

    fn push_string(&mut self, text: &str) -> Result<u64, UserFault> {
        self.push_bytes(&[0])?;
        self.push_bytes(text.as_bytes())
    }
}

/// What a new image starts with, as Linux's ELF loader hands it over.
#[derive(Clone, Copy)]
pub struct Start<'a> {
    pub executable: &'a Executable,
    /// Where the program's interpreter was placed (AT_BASE), 0 for a static program.
    pub interpreter_base: u64,
    /// The file executed (AT_EXECFN).
    pub path: &'a str,
    pub argv: &'a [String],
    pub env: &'a [String],
    /// The vDSO's ELF header in the job, if it has one.
    pub vdso: Option<u64>,
}

/// Writes the initial stack below `top` (in the active address space) and returns the
/// stack pointer to start with.
pub fn build(top: u64, start: &Start<'_>) -> Result<u64, UserFault> {
    let Start { executable, interpreter_base, path, argv, env, vdso } = *start;
    let mut stack = StackWriter { pointer: top };
    // Linux puts the executed file's name at the very top (AT_EXECFN), then the rest.
    let execfn = stack.push_string(path)?;
    let random = stack.push_bytes(&random_bytes())?;
    let platform = stack.push_string("x86_64")?;
    let env_pointers = env.iter().map(|text| stack.push_string(text)).collect::<Result<Vec<_>, _>>()?;
    let argv_pointers = argv.iter().map(|text| stack.push_string(text)).collect::<Result<Vec<_>, _>>()?;

    let auxv = [
        // AT_IGNORE (1) when there is no vDSO, so that the vector keeps its length.
        vdso.map_or((1, 0), |address| (AT_SYSINFO_EHDR, address)),
        (AT_PHDR, executable.program_headers_address),
        (AT_PHENT, executable.program_header_size),
        (AT_PHNUM, executable.program_header_count),
        (AT_PAGESZ, PAGE_SIZE),
        (AT_BASE, interpreter_base),
        (AT_FLAGS, 0),
        (AT_ENTRY, executable.entry),
        (AT_UID, 0),
        (AT_EUID, 0),
        (AT_GID, 0),
        (AT_EGID, 0),
        (AT_PLATFORM, platform),
        (AT_HWCAP, cpu::cpuid(1, 0).edx as u64),
        (AT_CLKTCK, 100),
        (AT_SECURE, 0),
        (AT_RANDOM, random),
        (AT_HWCAP2, 0),
        (AT_EXECFN, execfn),
        (AT_NULL, 0),
    ];
    let mut words: Vec<u64> = Vec::new();
    words.push(argv.len() as u64);
    words.extend(&argv_pointers);
    words.push(0);
    words.extend(&env_pointers);
    words.push(0);
    for (key, value) in auxv {
        words.extend([key, value]);
    }
    // argc must sit at a 16-byte boundary.
    let size = words.len() as u64 * 8;
    stack.pointer = (stack.pointer - size) & !15;
    copy_words_to_user(stack.pointer, &words)?;
    Ok(stack.pointer)
}
