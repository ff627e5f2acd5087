//! getcwd(buf, size): the job runs in `/`; a persistent enclave's job in the working
//! directory it was launched from on the host (where its relative paths lead).

use super::{user, Call, Errno, SyscallResult};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [buffer, size, ..] = call.args;
    if let Some(cwd) = crate::enclave::files::job_cwd() {
        let mut bytes = cwd.into_bytes();
        bytes.push(0);
        if (size as usize) < bytes.len() {
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
