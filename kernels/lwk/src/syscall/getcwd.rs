//! getcwd(buf, size): the job runs in `/`; a persistent enclave's job in the working
//! directory it was launched from on the host (where its relative paths lead).

use super::{user, Errno, SyscallResult, UserAddr};

pub fn getcwd(buffer: UserAddr, size: usize) -> SyscallResult {
    if let Some(cwd) = crate::enclave::files::job_cwd() {
        let mut bytes = cwd.into_bytes();
        bytes.push(0);
        if size < bytes.len() {
            return Err(Errno::ERANGE);
        }
        user::write_bytes(buffer, &bytes)?;
        return Ok(bytes.len() as u64);
    }
    if size < 2 {
        return Err(Errno::ERANGE);
    }
    user::write_bytes(buffer, b"/\0")?;
    Ok(2)
}
