//! Arbitrary files through the daemon's check of a job's binary (`executable::check`, which
//! reads the file with positioned reads, as it reads the descriptor a client sends): nothing may
//! panic, hang or allocate without bound; a refusal says something; what it lets
//! through is an x86-64 executable by its ELF header.
#![no_main]

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use clowderd::executable::check;
use libfuzzer_sys::fuzz_target;

/// One in-memory file, rewritten for every input (no disk I/O, no descriptor per input).
fn binary() -> &'static File {
    static FILE: OnceLock<File> = OnceLock::new();
    FILE.get_or_init(|| {
        // SAFETY: a fresh descriptor that nothing else owns, or -1 (checked).
        let fd = unsafe { libc::memfd_create(c"fuzz-binary".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        unsafe { File::from_raw_fd(fd) }
    })
}

fuzz_target!(|data: &[u8]| {
    let file = binary();
    file.set_len(0).expect("truncating the memfd");
    file.write_all_at(data, 0).expect("writing the memfd");
    match check(file) {
        Err(problem) => assert!(!problem.is_empty()),
        Ok(interpreter) => {
            assert!(elf64::FileHeader::parse(data).is_ok_and(|header| header.is_x86_64_executable()));
            assert!(interpreter.is_none_or(|path| path.starts_with('/')));
        }
    }
});
