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
