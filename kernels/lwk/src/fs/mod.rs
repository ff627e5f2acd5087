//! The job's files: a read-only in-memory file system built from a cpio archive given as
//! PVH module 0 (the job's binary and its inputs), Kitten's kfs in spirit. File contents
//! stay where the boot loader put them; nothing is copied.

use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::bootinfo::Module;
use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use lwk_core::cpio;

pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;

#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub mode: u32,
    /// Physical address and length of the contents (regular files).
    pub physical: u64,
    pub len: u64,
    /// A number unique in the file system (st_ino).
    pub inode: u64,
}

impl Node {
    pub fn is_directory(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    pub fn contents<'a>(&self) -> &'a [u8] {
        phys::bytes(self.physical, self.len as usize)
    }
}

static FILES: SpinLock<BTreeMap<String, Node>> = SpinLock::new(BTreeMap::new());

pub use cpio::is_archive;

#[derive(Debug)]
pub struct BadArchive;

/// Fills the file system from the archive in `module`: every entry under `/`, with the
/// directories its paths imply.
pub fn load_archive(module: &Module) -> Result<usize, BadArchive> {
    let archive = phys::bytes(module.start, module.size as usize);
    let entries = cpio::entries(archive).map_err(|_| BadArchive)?;
    let mut files = FILES.lock();
    let root = Node { mode: S_IFDIR | 0o755, physical: 0, len: 0, inode: 1 };
    files.insert(String::from("/"), root);
    for entry in &entries {
        let path = normalize("/", &entry.name).ok_or(BadArchive)?;
        // Parent directories first, whether or not the archive lists them.
        for (position, _) in path.match_indices('/').filter(|&(position, _)| position > 0) {
            let inode = files.len() as u64 + 1;
            files.entry(String::from(&path[..position])).or_insert(Node { mode: S_IFDIR | 0o755, physical: 0, len: 0, inode });
        }
        let inode = files.len() as u64 + 1;
        let node = Node { mode: entry.mode, physical: module.start + entry.data_offset as u64, len: entry.data_len as u64, inode };
        files.insert(path, node);
    }
    Ok(entries.len())
}

/// Path names made absolute (pure logic, in `lwk-core`).
pub use lwk_core::path::normalize;

pub fn lookup(path: &str) -> Option<Node> {
    FILES.lock().get(path).copied()
}

/// The names directly inside `directory`, in order, with their nodes.
pub fn list(directory: &str) -> Vec<(String, Node)> {
    let prefix = if directory == "/" { String::from("/") } else { alloc::format!("{directory}/") };
    FILES
        .lock()
        .range(prefix.clone()..)
        .take_while(|(path, _)| path.starts_with(&prefix))
        .filter(|(path, _)| path.len() > prefix.len() && !path[prefix.len()..].contains('/'))
        .map(|(path, node)| (String::from(&path[prefix.len()..]), *node))
        .collect()
}

/// Empties the file system (a persistent enclave's job ended; the next brings its own files).
pub fn clear() {
    let mut files = FILES.lock();
    files.clear();
    published(&files);
}

/// Tells the ring-3 file calls (`crate::enclave::slots`) which paths are the job's own.
fn published(files: &BTreeMap<String, Node>) {
    let told = crate::enclave::slots::publish_job_files(files.keys().map(String::as_str));
    crate::arch::fastcall::set_job_files(!told && !files.is_empty());
}

/// Adds one read-only file at `/name` (an enclave job's input, placed in memory by the host),
/// with the directories its path implies.
pub fn add_file(name: &str, physical: u64, len: u64) -> Option<()> {
    let path = normalize("/", name)?;
    let mut files = FILES.lock();
    files.entry(String::from("/")).or_insert(Node { mode: S_IFDIR | 0o755, physical: 0, len: 0, inode: 1 });
    for (position, _) in path.match_indices('/').filter(|&(position, _)| position > 0) {
        let inode = files.len() as u64 + 1;
        files.entry(String::from(&path[..position])).or_insert(Node { mode: S_IFDIR | 0o755, physical: 0, len: 0, inode });
    }
    let inode = files.len() as u64 + 1;
    files.insert(path, Node { mode: 0o100444, physical, len, inode });
    published(&files);
    Some(())
}
