//! Moving data between system calls and user memory, turning bad pointers into EFAULT.

use super::Errno;
use crate::arch::trap::{copy_from_user, copy_to_user, copy_words_to_user};
use crate::linux::uapi;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Add;

/// An address in the job's memory that a system call reads or writes (a `T *` argument, or a
/// pointer found in a structure there). Nothing about it is trusted: every access is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserAddr(pub u64);

impl UserAddr {
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// `None` for NULL, for the many arguments that are optional.
    pub fn non_null(self) -> Option<UserAddr> {
        (!self.is_null()).then_some(self)
    }
}

/// `address + bytes`, as C's pointer arithmetic on bytes (wrapping: the access then fails).
impl Add<u64> for UserAddr {
    type Output = UserAddr;
    fn add(self, bytes: u64) -> UserAddr {
        UserAddr(self.0.wrapping_add(bytes))
    }
}

pub fn read_bytes(address: UserAddr, len: usize) -> Result<Vec<u8>, Errno> {
    let mut bytes = vec![0; len];
    read_into(address, &mut bytes)?;
    Ok(bytes)
}

/// Fills `bytes` from user memory at `address`.
pub fn read_into(address: UserAddr, bytes: &mut [u8]) -> Result<(), Errno> {
    copy_from_user(bytes, address.0).map_err(|_| Errno::EFAULT)
}

pub fn write_bytes(address: UserAddr, bytes: &[u8]) -> Result<(), Errno> {
    copy_to_user(address.0, bytes).map_err(|_| Errno::EFAULT)
}

/// Writes 64-bit words (the layout of most Linux structures on x86-64).
pub fn write_words(address: UserAddr, words: &[u64]) -> Result<(), Errno> {
    copy_words_to_user(address.0, words).map_err(|_| Errno::EFAULT)
}

/// Most words one `read_words` reads (the largest structure read so has 5).
const MAX_WORDS: usize = 8;

/// `N` 64-bit words from user memory, through a buffer on the stack (an allocation is
/// emulated work on PVM, about as much as the rest of a small system call).
pub fn read_words<const N: usize>(address: UserAddr) -> Result<[u64; N], Errno> {
    const { assert!(N <= MAX_WORDS, "read_words reads at most MAX_WORDS words") };
    let mut buffer = [0u8; MAX_WORDS * 8];
    let bytes = &mut buffer[..N * 8];
    read_into(address, bytes)?;
    let mut words = [0u64; N];
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_le_bytes(chunk.try_into().unwrap());
    }
    Ok(words)
}

/// A NUL-terminated string of at most `MAX_STRING` bytes (an argument or environment
/// string), read a page at a time.
pub fn read_string(address: UserAddr) -> Result<String, Errno> {
    const MAX_STRING: usize = 128 * 1024;
    const PAGE: u64 = 4096;
    let mut bytes = Vec::new();
    loop {
        let at = address + bytes.len() as u64;
        let chunk = read_bytes(at, (PAGE - at.0 % PAGE) as usize)?;
        match chunk.iter().position(|&byte| byte == 0) {
            Some(end) => {
                bytes.extend_from_slice(&chunk[..end]);
                return String::from_utf8(bytes).map_err(|_| Errno::EINVAL);
            }
            None if bytes.len() + chunk.len() > MAX_STRING => return Err(Errno::E2BIG),
            None => bytes.extend_from_slice(&chunk),
        }
    }
}

/// A NUL-terminated path, at most PATH_MAX bytes.
pub fn read_path(address: UserAddr) -> Result<String, Errno> {
    const PATH_MAX: usize = uapi::PATH_MAX as usize;
    // A piece at a time, never past the end of a page (the next may be unmapped): each call
    // into the copy costs ~35 emulated instructions on PVM, so not one per byte.
    const PIECE: u64 = 64;
    let mut path = Vec::new();
    let mut piece = [0u8; PIECE as usize];
    loop {
        let at = address.0.checked_add(path.len() as u64).ok_or(Errno::EFAULT)?;
        let len = PIECE.min(4096 - at % 4096) as usize;
        copy_from_user(&mut piece[..len], at).map_err(|_| Errno::EFAULT)?;
        match piece[..len].iter().position(|&byte| byte == 0) {
            Some(end) => {
                path.extend_from_slice(&piece[..end]);
                break;
            }
            None => path.extend_from_slice(&piece[..len]),
        }
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
    }
    String::from_utf8(path).map_err(|_| Errno::ENOENT)
}
