//! fstat(fd, statbuf): the standard descriptors describe themselves as a pipe, which is what
//! they are to the job (a stream with no terminal behind it).

use super::{user, Call, Errno, SyscallResult};

const S_IFIFO: u64 = 0o010000;

/// Fills a `struct stat` (144 bytes on x86-64) for a standard descriptor.
pub fn stat_descriptor(descriptor: u64, address: u64) -> SyscallResult {
    if descriptor > 2 {
        return Err(Errno::EBADF);
    }
    let mut stat = [0u64; 18];
    stat[0] = 0xc; // st_dev: a pipe filesystem
    stat[1] = descriptor + 1; // st_ino
    stat[2] = 1; // st_nlink
    stat[3] = S_IFIFO | 0o600; // st_mode (32 bits) and st_uid (0)
    stat[7] = 4096; // st_blksize
    user::write_words(address, &stat)?;
    Ok(0)
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    stat_descriptor(call.args[0], call.args[1])
}
