//! Reading a directory's entries in the layout of Linux's `getdents64` (`struct
//! linux_dirent64`), for a caller that hands them on as they are: an enclave's job reading a
//! host directory.

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;

use rustix::fs::{FileType, RawDir, SeekFrom};

/// The fixed part of a `linux_dirent64`: inode (8), offset (8), record length (2), type (1).
const HEADER_LEN: usize = 19;

/// `d_type` of a file type, as Linux's `DT_*`.
fn dirent_type(kind: FileType) -> u8 {
    match kind {
        FileType::Fifo => 1,
        FileType::CharacterDevice => 2,
        FileType::Directory => 4,
        FileType::BlockDevice => 6,
        FileType::RegularFile => 8,
        FileType::Symlink => 10,
        FileType::Socket => 12,
        FileType::Unknown => 0,
    }
}

/// The next entries of the open directory `dir`, as `getdents64` would write them into a buffer
/// of `len` bytes: whole records only, the directory's position just past the last one given,
/// an empty result at the end. EINVAL when not even the next entry fits, as Linux does.
pub fn read_directory(dir: &File, len: usize) -> io::Result<Vec<u8>> {
    let mut records = Vec::new();
    let mut last_cookie = None;
    let mut buffer = vec![MaybeUninit::<u8>::uninit(); len.clamp(HEADER_LEN + 1, 64 * 1024)];
    let mut entries = RawDir::new(dir, &mut buffer);
    while let Some(entry) = entries.next() {
        let entry = entry?;
        let name = entry.file_name().to_bytes_with_nul();
        let record_len = (HEADER_LEN + name.len()).next_multiple_of(8);
        if records.len() + record_len > len {
            if last_cookie.is_none() {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            break;
        }
        let cookie = entry.next_entry_cookie();
        records.extend_from_slice(&entry.ino().to_ne_bytes());
        records.extend_from_slice(&cookie.to_ne_bytes());
        records.extend_from_slice(&(record_len as u16).to_ne_bytes());
        records.push(dirent_type(entry.file_type()));
        records.extend_from_slice(name);
        records.resize(records.len().next_multiple_of(8), 0);
        last_cookie = Some(cookie);
    }
    // RawDir may have read entries past those given: the directory resumes after the last one.
    if let Some(cookie) = last_cookie {
        rustix::fs::seek(dir, SeekFrom::Start(cookie))?;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `records` (linux_dirent64 records), checking each record's layout.
    fn names(records: &[u8]) -> Vec<String> {
        let mut names = Vec::new();
        let mut at = 0;
        while at < records.len() {
            let record_len = u16::from_ne_bytes([records[at + 16], records[at + 17]]) as usize;
            assert_eq!(record_len % 8, 0);
            let name = &records[at + HEADER_LEN..at + record_len];
            let end = name.iter().position(|&byte| byte == 0).expect("a NUL-terminated name");
            names.push(String::from_utf8(name[..end].to_vec()).unwrap());
            at += record_len;
        }
        assert_eq!(at, records.len());
        names
    }

    #[test]
    fn small_buffers_give_every_entry_once_and_too_small_ones_einval() {
        let dir = std::env::temp_dir().join(format!("clowder-sys-dirents-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut expected: Vec<String> = (0..60).map(|i| format!("entry-with-a-longer-name-{i:03}")).collect();
        for name in &expected {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let handle = File::open(&dir).unwrap();
        assert_eq!(read_directory(&handle, 8).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        let mut seen = Vec::new();
        loop {
            let records = read_directory(&handle, 200).unwrap();
            assert!(records.len() <= 200);
            if records.is_empty() {
                break;
            }
            seen.extend(names(&records));
        }
        seen.retain(|name| name != "." && name != "..");
        seen.sort();
        expected.sort();
        assert_eq!(seen, expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
