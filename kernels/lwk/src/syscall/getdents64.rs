//! getdents64(fd, dirp, count): the entries of a directory of the job's file system, `.` and
//! `..` first, as `struct linux_dirent64` records.

use super::{user, Errno, Fd, SyscallResult, UserAddr};
use crate::fs::{self, Node, S_IFDIR, S_IFMT};
use crate::job::{self, descriptors::Descriptor};
use alloc::string::String;
use alloc::vec::Vec;

const DT_DIR: u8 = 4;
const DT_REG: u8 = 8;

pub fn getdents64(descriptor: Fd, buffer: UserAddr, capacity: usize) -> SyscallResult {
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
        let length = (19 + name.len() + 1).next_multiple_of(8);
        if records.len() + length > capacity {
            break;
        }
        next += 1;
        records.extend((entry.inode).to_le_bytes());
        records.extend((next as u64).to_le_bytes()); // d_off: where the next read starts
        records.extend((length as u16).to_le_bytes());
        records.push(if entry.mode & S_IFMT == S_IFDIR { DT_DIR } else { DT_REG });
        records.extend(name.as_bytes());
        records.resize(records.len() + length - 19 - name.len(), 0);
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
