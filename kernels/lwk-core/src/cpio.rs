//! Reading a "newc" cpio archive (the initramfs format): the files a job gets at launch.

use alloc::string::String;
use alloc::vec::Vec;

const MAGIC: &[u8] = b"070701";
const HEADER_SIZE: usize = 110;
const TRAILER: &str = "TRAILER!!!";

pub struct Entry {
    pub name: String,
    pub mode: u32,
    /// Offset and length of the contents in the archive.
    pub data_offset: usize,
    pub data_len: usize,
}

#[derive(Debug)]
pub struct BadArchive;

pub fn is_archive(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

fn hex_field(header: &[u8], index: usize) -> Result<usize, BadArchive> {
    let field = header.get(6 + index * 8..14 + index * 8).ok_or(BadArchive)?;
    let text = core::str::from_utf8(field).map_err(|_| BadArchive)?;
    usize::from_str_radix(text, 16).map_err(|_| BadArchive)
}

pub fn entries(archive: &[u8]) -> Result<Vec<Entry>, BadArchive> {
    let mut entries = Vec::new();
    let mut offset = 0;
    loop {
        let header = archive.get(offset..offset + HEADER_SIZE).ok_or(BadArchive)?;
        if !header.starts_with(MAGIC) {
            return Err(BadArchive);
        }
        let mode = hex_field(header, 1)? as u32;
        let data_len = hex_field(header, 6)?;
        let name_len = hex_field(header, 11)?;
        let name_start = offset + HEADER_SIZE;
        let name_field = archive.get(name_start..name_start + name_len).ok_or(BadArchive)?;
        // The name ends at its first NUL; writers may pad it with more to align the data.
        let name_bytes = &name_field[..name_field.iter().position(|&byte| byte == 0).unwrap_or(name_field.len())];
        let name = String::from(core::str::from_utf8(name_bytes).map_err(|_| BadArchive)?);
        let data_offset = (name_start + name_len).next_multiple_of(4);
        if data_offset + data_len > archive.len() {
            return Err(BadArchive);
        }
        if name == TRAILER {
            return Ok(entries);
        }
        entries.push(Entry { name, mode, data_offset, data_len });
        offset = (data_offset + data_len).next_multiple_of(4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// A newc entry as `cpio -o -H newc` writes it; `padding` NULs after the name's own.
    fn entry(name: &str, mode: u32, data: &[u8], padding: usize) -> Vec<u8> {
        let name_len = name.len() + 1 + padding;
        let mut fields = vec![0usize; 13];
        fields[1] = mode as usize;
        fields[6] = data.len();
        fields[11] = name_len;
        let mut bytes: Vec<u8> = MAGIC.to_vec();
        for field in fields {
            bytes.extend(std::format!("{field:08x}").bytes());
        }
        bytes.extend(name.bytes());
        bytes.resize(bytes.len() + 1 + padding, 0);
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes.extend(data);
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes
    }

    fn archive(members: &[(&str, u32, &[u8], usize)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for &(name, mode, data, padding) in members {
            bytes.extend(entry(name, mode, data, padding));
        }
        bytes.extend(entry(TRAILER, 0, b"", 0));
        bytes
    }

    #[test]
    fn reads_names_modes_and_data() {
        let bytes = archive(&[("hello", 0o100755, b"#!", 0), ("dir/input.txt", 0o100644, b"one\ntwo\n", 0), ("dir", 0o040755, b"", 0)]);
        assert!(is_archive(&bytes));
        let entries = entries(&bytes).unwrap();
        let names: Vec<&str> = entries.iter().map(|entry| entry.name.as_str()).collect();
        assert_eq!(names, ["hello", "dir/input.txt", "dir"]);
        assert_eq!(entries[0].mode, 0o100755);
        let data = &entries[1];
        assert_eq!(&bytes[data.data_offset..data.data_offset + data.data_len], b"one\ntwo\n");
    }

    #[test]
    fn names_padded_with_nuls_put_data_on_a_page() {
        // test.sh's make_archive pads names so that data starts on a page boundary.
        let padding = 4096 - 110 - "job".len() - 1;
        let bytes = archive(&[("job", 0o100755, b"ELF", padding)]);
        let entries = entries(&bytes).unwrap();
        assert_eq!(entries[0].name, "job");
        assert_eq!(entries[0].data_offset, 4096);
    }

    #[test]
    fn refuses_what_is_not_a_whole_archive() {
        let whole = archive(&[("hello", 0o100644, b"data", 0)]);
        assert!(!is_archive(b"\x7fELF"));
        assert!(entries(b"\x7fELF").is_err());
        // Cut anywhere before the trailer's end: an error, never a panic.
        for len in 0..whole.len() - 4 {
            assert!(entries(&whole[..len]).is_err(), "cut at {len}");
        }
        let mut bad_hex = whole.clone();
        bad_hex[6 + 8] = b'x';
        assert!(entries(&bad_hex).is_err());
        let mut too_long = whole;
        too_long[6 + 6 * 8..6 + 7 * 8].copy_from_slice(b"7fffffff");
        assert!(entries(&too_long).is_err());
    }
}
