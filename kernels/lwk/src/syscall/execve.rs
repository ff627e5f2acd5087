//! execve(path, argv, envp): replaces the calling process's image with an executable of the
//! job's file system (the cpio archive, or the files sent with a persistent enclave's job;
//! `/proc/self/exe` is the current executable). See `crate::process::exec`: O_CLOEXEC
//! descriptors close, caught signals return to their default action, the mask stays.
//! ENOENT for a missing file (or interpreter, for a dynamically linked one), EACCES for a
//! directory, ENOEXEC for what is not an ELF executable (a shell then runs a script itself),
//! ELIBBAD for an interpreter that is not loadable, ENOMEM when its memory cannot be had.

use super::{SyscallResult, UserAddr};
use crate::arch::trap::TrapFrame;
use crate::process;

pub fn execve(frame: &mut TrapFrame, path: UserAddr, argv: UserAddr, envp: UserAddr) -> SyscallResult {
    process::exec(frame, path, argv, envp)?;
    // The new image starts with RAX = 0, as the value returned here.
    Ok(0)
}
