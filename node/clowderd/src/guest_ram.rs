//! The daemon's mapping of an enclave's RAM (the VMM's memfd), with every access checked against
//! the enclave's RAM ranges: guest-physical addresses come from the enclave and are not trusted.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// One run of guest RAM and where it lives in the memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    pub gpa: u64,
    pub size: u64,
    pub file_offset: u64,
}

/// A guest-physical range the enclave named is not plain RAM it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadAddress {
    pub gpa: u64,
    pub len: u64,
}

impl std::fmt::Display for BadAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "guest range {:#x}+{:#x} is not enclave RAM", self.gpa, self.len)
    }
}

pub struct GuestRam {
    base: NonNull<u8>,
    mapped_len: usize,
    ranges: Vec<RamRange>,
    /// The channel region: RAM, but never a buffer for file data.
    reserved: (u64, u64),
    /// The memfd itself, to hand runs of RAM to other processes (XEMEM attaches).
    file: File,
    /// The smallest piece of the memfd another process can map: its page size (2 MiB for a
    /// hugetlb memfd, whose pages cannot be mapped in part).
    mappable_unit: u64,
    /// Where the kernel keeps its count of page-table changes, once it said: its guest-physical
    /// address and its offset in the mapping.
    mapping_counter: std::sync::OnceLock<(u64, usize)>,
}

// SAFETY: the mapping is plain shared memory; `GuestRam` hands out copies, never references,
// so moving or sharing it between threads is sound.
unsafe impl Send for GuestRam {}
unsafe impl Sync for GuestRam {}

impl GuestRam {
    /// Maps the whole memfd shared. `reserved` is the channel's guest range.
    pub fn map(memfd: &File, ranges: Vec<RamRange>, reserved: (u64, u64)) -> io::Result<GuestRam> {
        let mapped_len = usize::try_from(memfd.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "memfd larger than the address space"))?;
        for range in &ranges {
            let end = range.file_offset.checked_add(range.size);
            if end.is_none_or(|end| end > mapped_len as u64) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("RAM range {range:?} lies outside the memfd")));
            }
        }
        let file = memfd.try_clone()?;
        // SAFETY: a fresh shared mapping of a file we hold; the kernel picks the address.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), mapped_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd.as_raw_fd(), 0)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let mappable_unit = std::os::unix::fs::MetadataExt::blksize(&file.metadata()?).max(xemem::PAGE_SIZE);
        Ok(GuestRam { base, mapped_len, ranges, reserved, file, mappable_unit, mapping_counter: std::sync::OnceLock::new() })
    }

    /// Host address of `[file_offset, file_offset + len)` in the mapping, for the channel.
    pub fn host_address(&self, file_offset: u64, len: u64) -> Option<*mut u8> {
        let end = file_offset.checked_add(len)?;
        if end > self.mapped_len as u64 {
            return None;
        }
        // SAFETY: in bounds of the mapping, checked above.
        Some(unsafe { self.base.as_ptr().add(file_offset as usize) })
    }

    /// Clears a guest range (in one RAM run, outside the channel): the enclave's kernel gives
    /// memory back this way, at host speed.
    pub fn zero(&self, gpa: u64, len: u64) -> Result<(), BadAddress> {
        let offset = self.locate(gpa, len)?;
        // SAFETY: `locate` keeps the range inside the mapping; the guest asked for it to be
        // cleared and does not use it meanwhile (if it did, that is its own race).
        unsafe { std::ptr::write_bytes(self.base.as_ptr().add(offset), 0, len as usize) };
        Ok(())
    }

    /// The memfd offset of a guest range that lies in one RAM run and outside the channel.
    fn locate(&self, gpa: u64, len: u64) -> Result<usize, BadAddress> {
        let bad = BadAddress { gpa, len };
        let end = gpa.checked_add(len).ok_or(bad)?;
        let (reserved_start, reserved_len) = self.reserved;
        if gpa < reserved_start + reserved_len && reserved_start < end {
            return Err(bad);
        }
        let range = self.ranges.iter().find(|r| gpa >= r.gpa && end <= r.gpa + r.size).ok_or(bad)?;
        Ok((range.file_offset + (gpa - range.gpa)) as usize)
    }

    pub fn read(&self, gpa: u64, buffer: &mut [u8]) -> Result<(), BadAddress> {
        let offset = self.locate(gpa, buffer.len() as u64)?;
        // SAFETY: `locate` keeps the range inside the mapping. The guest may write the same bytes
        // concurrently; that is its own race, and we only copy bytes out.
        unsafe { std::ptr::copy_nonoverlapping(self.base.as_ptr().add(offset), buffer.as_mut_ptr(), buffer.len()) };
        Ok(())
    }

    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<(), BadAddress> {
        let offset = self.locate(gpa, data.len() as u64)?;
        // SAFETY: as in `read`; we only copy bytes in.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Moves file data straight between `file` and a guest range (in one RAM run, outside the
    /// channel), with no copy in between: `read`/`pread` into guest memory when `into_guest`,
    /// else `write`/`pwrite` from it; at `offset`, or at the file's own position when `None`.
    /// The outer error is a range the guest may not name; the inner one the file call's.
    pub fn file_io(&self, file: &File, gpa: u64, len: u64, into_guest: bool, offset: Option<u64>) -> Result<io::Result<usize>, BadAddress> {
        let start = self.locate(gpa, len)?;
        // SAFETY: `locate` keeps the range inside the mapping. The kernel copies between the
        // file and these bytes; the guest may touch them meanwhile, which is its own race, and
        // no Rust reference to them exists.
        let buffer = unsafe { self.base.as_ptr().add(start) }.cast::<libc::c_void>();
        let fd = file.as_raw_fd();
        let offset = offset.map(|offset| libc::off_t::try_from(offset).unwrap_or(libc::off_t::MAX));
        let len = len as usize;
        // SAFETY: `buffer` holds `len` bytes of the mapping (above); `fd` is an open file.
        let count = unsafe {
            match (into_guest, offset) {
                (true, None) => libc::read(fd, buffer, len),
                (true, Some(offset)) => libc::pread(fd, buffer, len, offset),
                (false, None) => libc::write(fd, buffer, len),
                (false, Some(offset)) => libc::pwrite(fd, buffer, len, offset),
            }
        };
        Ok(usize::try_from(count).map_err(|_| io::Error::last_os_error()))
    }

    /// The memfd and offset holding a guest range that lies in one RAM run and outside the
    /// channel: how an enclave's frames are shared with a host process without copying.
    pub fn file_range(&self, gpa: u64, len: u64) -> Result<(&File, u64), BadAddress> {
        self.locate(gpa, len).map(|offset| (&self.file, offset as u64))
    }

    /// What another process needs to map the same RAM under the same checks (a job's socket
    /// helper): the memfd, the RAM runs and the channel's range.
    pub fn layout(&self) -> (&File, &[RamRange], (u64, u64)) {
        (&self.file, &self.ranges, self.reserved)
    }

    /// The host address of a guest range that lies in one RAM run and outside the channel, for
    /// a system call to read or write it in place (a socket's iovec).
    pub fn host_range(&self, gpa: u64, len: u64) -> Result<*mut u8, BadAddress> {
        // SAFETY: `locate` keeps the range inside the mapping.
        self.locate(gpa, len).map(|offset| unsafe { self.base.as_ptr().add(offset) })
    }

    /// The smallest piece of the RAM memfd another process (or VMM) can map, in bytes.
    pub fn mappable_unit(&self) -> u64 {
        self.mappable_unit
    }

    /// Notes where the kernel keeps its count of page-table changes (`MappingCounter`): an
    /// aligned u64 in RAM, said once (a second, different place is refused).
    pub fn publish_mapping_counter(&self, gpa: u64) -> Result<(), BadAddress> {
        let bad = BadAddress { gpa, len: 8 };
        if gpa % 8 != 0 {
            return Err(bad);
        }
        let offset = self.locate(gpa, 8)?;
        match self.mapping_counter.get_or_init(|| (gpa, offset)) {
            known if *known == (gpa, offset) => Ok(()),
            _ => Err(bad),
        }
    }

    /// The piece of RAM the kernel's count of page-table changes lies in (the smallest piece
    /// another machine can map, which the kernel keeps for the count alone): the memfd, the
    /// piece's offset in it and its length, and the count's offset in the piece. `None` before
    /// the kernel said where, or if that piece is not RAM of one run outside the channel.
    pub fn mapping_counter_piece(&self) -> Option<(&File, u64, u64, u64)> {
        let (gpa, _) = *self.mapping_counter.get()?;
        let piece = gpa / self.mappable_unit * self.mappable_unit;
        let offset = self.locate(piece, self.mappable_unit).ok()?;
        Some((&self.file, offset as u64, self.mappable_unit, gpa - piece))
    }

    /// The kernel's count of page-table changes now, if it published one. The guest's word:
    /// it decides only whether the guest's own frames are asked for again.
    pub fn mapping_changes(&self) -> Option<u64> {
        let (_, offset) = *self.mapping_counter.get()?;
        // SAFETY: `publish_mapping_counter` checked that the aligned word lies in the mapping;
        // the guest writes it concurrently, so it is read as an atomic.
        let word = unsafe { &*(self.base.as_ptr().add(offset) as *const std::sync::atomic::AtomicU64) };
        Some(word.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Checks a range without touching it (to refuse a call before it has effects).
    pub fn check(&self, gpa: u64, len: u64) -> Result<(), BadAddress> {
        self.locate(gpa, len).map(|_| ())
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no references into it exist.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn accesses_stay_inside_ram_and_outside_the_channel() {
        let mut file = crate::sys::memfd("guest-ram-test").unwrap();
        file.write_all(&vec![0u8; 64 * 1024]).unwrap();
        let ranges =
            vec![RamRange { gpa: 0, size: 16 * 1024, file_offset: 0 }, RamRange { gpa: 1 << 32, size: 16 * 1024, file_offset: 32 * 1024 }];
        let ram = GuestRam::map(&file, ranges, (12 * 1024, 4096)).unwrap();
        ram.write(100, b"hello").unwrap();
        let mut back = [0u8; 5];
        ram.read(100, &mut back).unwrap();
        assert_eq!(&back, b"hello");
        ram.write((1 << 32) + 8, b"high").unwrap();
        let mut high = [0u8; 4];
        ram.read((1 << 32) + 8, &mut high).unwrap();
        assert_eq!(&high, b"high");
        assert!(ram.write(16 * 1024 - 2, b"abc").is_err(), "crosses the end of a run");
        assert!(ram.write(12 * 1024 + 10, b"x").is_err(), "inside the channel");
        assert!(ram.read(u64::MAX - 1, &mut back).is_err(), "wraps around");
        assert!(ram.check(20 * 1024, 1).is_err(), "in the hole between runs");
        ram.zero(0, 4096).unwrap();
        ram.read(100, &mut back).unwrap();
        assert_eq!(back, [0; 5], "zeroed");
        assert!(ram.zero(8 * 1024, 8 * 1024).is_err(), "would clear the channel");
        assert!(ram.zero(1 << 32, 32 * 1024).is_err(), "beyond its run");
        assert_eq!(ram.mapping_changes(), None, "not published yet");
        assert!(ram.publish_mapping_counter(4).is_err(), "unaligned");
        assert!(ram.publish_mapping_counter(12 * 1024).is_err(), "inside the channel");
        assert!(ram.publish_mapping_counter(20 * 1024).is_err(), "not RAM");
        ram.publish_mapping_counter(2048).unwrap();
        ram.write(2048, &7u64.to_le_bytes()).unwrap();
        assert_eq!(ram.mapping_changes(), Some(7));
        assert!(ram.publish_mapping_counter(4096).is_err(), "a second place");
        ram.publish_mapping_counter(2048).unwrap();
        let bad = vec![RamRange { gpa: 0, size: 1 << 20, file_offset: 0 }];
        assert!(GuestRam::map(&file, bad, (0, 0)).is_err());
    }
}
