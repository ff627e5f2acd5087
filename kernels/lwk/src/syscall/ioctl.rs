//! ioctl(fd, request, arg): `/dev/xpmem` takes XPMEM's commands (`crate::xpmem`), whose
//! argument is always a pointer to the command's structure. A socket takes FIONBIO (its
//! non-blocking mode, as fcntl's O_NONBLOCK) and the read-only queries the host answers on
//! its socket as the job's user (`enclave_proto::socket::ioctl`): SIOCGIFCONF and the
//! interface queries, so Open MPI, PMIx and UCX find the node's interfaces, and FIONREAD. No
//! other descriptor is a terminal or a device, and no other request is passed on, so the rest
//! fail with ENOTTY, as on a pipe or a file (libc then chooses full buffering for the console).

use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::job;
use crate::job::descriptors::Descriptor;
use crate::net::{self, Socket};
use alloc::sync::Arc;
use enclave_proto::socket::ioctl::{self as requests, IFREQ_LEN, INTERFACES_MAX, SIOCGIFCONF};
use enclave_proto::SocketOp;

/// Linux's FIONBIO (asm-generic/ioctls.h): kept here, never passed on.
const FIONBIO: u32 = 0x5421;

enum Target {
    Xpmem,
    Socket(Arc<Socket>),
    Other,
}

pub fn ioctl(fd: Fd, request: u32, argument: UserAddr) -> SyscallResult {
    if let Some(result) = crate::xpmem::parking(fd, request, argument) {
        return result;
    }
    let target = job::with_process(|process| {
        process.descriptors.get(fd).map(|open| match &*open {
            Descriptor::Xpmem => Target::Xpmem,
            Descriptor::Socket(socket) => Target::Socket(socket.clone()),
            _ => Target::Other,
        })
    });
    match target.ok_or(Errno::EBADF)? {
        Target::Xpmem => crate::xpmem::ioctl(request, argument),
        Target::Socket(socket) => socket_ioctl(&socket, request, argument),
        Target::Other => Err(Errno::ENOTTY),
    }
}

fn socket_ioctl(socket: &Socket, request: u32, argument: UserAddr) -> SyscallResult {
    match request {
        FIONBIO => {
            let mut value = [0u8; 4];
            user::read_into(argument, &mut value)?;
            socket.set_non_blocking(i32::from_le_bytes(value) != 0);
            Ok(0)
        }
        SIOCGIFCONF => interfaces(socket, argument),
        _ => {
            let len = requests::argument_len(request).ok_or(Errno::ENOTTY)?;
            // Read first: the interface queries take the name (or SIOCGIFNAME the index) in.
            let value = user::read_bytes(argument, len)?;
            let answer = net::request(SocketOp::Ioctl { handle: socket.handle, request, argument: &value });
            let result = net::result_of(answer.result)?;
            if answer.data.len() != len {
                return Err(Errno::EIO);
            }
            user::write_bytes(argument, &answer.data)?;
            Ok(result)
        }
    }
}

/// SIOCGIFCONF: `struct ifconf { int ifc_len; char *ifc_buf; }` (16 bytes). A NULL buffer asks
/// for the length the whole list needs; else as many whole `ifreq`s as `ifc_len` holds are
/// written, and `ifc_len` becomes the bytes written, as Linux's `dev_ifconf` does.
fn interfaces(socket: &Socket, argument: UserAddr) -> SyscallResult {
    let [len, buffer] = user::read_words::<2>(argument)?;
    let (room, buffer) = (len as u32 as i32, UserAddr(buffer));
    let used = if buffer.is_null() || room >= IFREQ_LEN as i32 {
        // 0 asks the host for the length only (never a length for a real buffer here).
        let wanted = if buffer.is_null() { 0 } else { (room as u32).min(INTERFACES_MAX) };
        let answer = net::request(SocketOp::Interfaces { handle: socket.handle, len: wanted });
        let used = net::result_of(answer.result)?;
        if !buffer.is_null() {
            if answer.data.len() as u64 != used || used > wanted as u64 {
                return Err(Errno::EIO);
            }
            user::write_bytes(buffer, &answer.data)?;
        }
        used
    } else {
        0
    };
    user::write_bytes(argument, &(used as i32).to_le_bytes())?;
    Ok(0)
}
