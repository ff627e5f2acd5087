//! getdents64(fd, dirp, count): the entries of a directory of the job's file system, `.` and
//! `..` first, as `struct linux_dirent64` records; a host directory's from the host.

use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::fs::{self, Node, S_IFDIR, S_IFMT};
use crate::job::{self, descriptors::Descriptor};
use crate::linux::linux_dirent64;
use crate::linux_consts;
use crate::linux_struct;
use alloc::string::String;
use alloc::vec::Vec;
use core::mem::offset_of;

/// Where a record's name starts (the fixed part's size before alignment).
const NAME_AT: usize = offset_of!(linux_dirent64, d_name);
linux_consts!(u8: DT_DIR, DT_REG);

pub fn getdents64(descriptor: Fd, buffer: UserAddr, capacity: usize) -> SyscallResult {
    // A host directory (a persistent enclave's job): the host lists it.
    if let Some(handle) = crate::enclave::files::remote_handle(descriptor) {
        return crate::enclave::files::to_syscall_result(crate::enclave::files::read_directory(handle, buffer.0, capacity as u64));
    }
    let (path, node, position) = job::with_process(|process| match process.descriptors.get(descriptor).as_deref_mut() {
        Some(Descriptor::Directory { path, node, position }) => Ok((path.clone(), *node, *position)),
        Some(_) => Err(Errno::ENOTDIR),
        None => Err(Errno::EBADF),
    })?;
    let mut entries: Vec<(String, Node)> = Vec::new();
    entries.push((String::from("."), node));
    entries.push((String::from(".."), node));
    entries.extend(fs::list(&path));

    let mut records: Vec<u8> = Vec::new();
    let mut next = position;
    for (name, entry) in entries.iter().skip(position) {
        let length = (NAME_AT + name.len() + 1).next_multiple_of(8);
        if records.len() + length > capacity {
            break;
        }
        next += 1;
        let header = linux_struct!(linux_dirent64 {
            d_ino: entry.inode,
            d_off: next as i64, // where the next read starts
            d_reclen: length as u16,
            d_type: if entry.mode & S_IFMT == S_IFDIR { DT_DIR } else { DT_REG },
        });
        records.extend_from_slice(&header[..NAME_AT]);
        records.extend(name.as_bytes());
        records.resize(records.len() + length - NAME_AT - name.len(), 0);
    }
    if next == position && position < entries.len() {
        return Err(Errno::EINVAL); // the buffer cannot hold one entry
    }
    user::write_bytes(buffer, &records)?;
    job::with_process(|process| {
        if let Some(Descriptor::Directory { position, .. }) = process.descriptors.get(descriptor).as_deref_mut() {
            *position = next;
        }
    });
    Ok(records.len() as u64)
}
