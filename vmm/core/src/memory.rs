//! Guest memory: one memfd per VM, preallocated, mapped once and registered as contiguous
//! guest-physical RAM; plus regions added and removed while the guest runs (new memory slots over
//! any file descriptor), and translation of guest-physical ranges into (file, offset) runs.
//!
//! A run-time region over a file the VMM does not own (an enclave job's `mmap(MAP_SHARED)` of
//! a host `/dev/shm` file) can be truncated on the host under the guest. The guest's next
//! touch of a page past the new end cannot be served. On this PVM host KVM then retries the
//! access forever inside `KVM_RUN` (the job hangs, its vCPU busy); a stock KVM fails
//! `KVM_RUN` with `EFAULT`, which used to stop the whole VM. [`cover_truncated_files`] replaces
//! every such tail by private zero pages (what a fresh mapping past the end would hold were it
//! allowed), names the file in one log line, and the access completes. It runs from the vCPU
//! loop on `EFAULT` and once a second from a watcher thread while file regions exist (PVM
//! never returns to user space; a stat of each file a second is cheaper and simpler than an
//! inotify watch per file). Other designs were weaker: a SIGBUS handler in the VMM never sees
//! the guest's access (KVM takes the fault, not the vCPU thread), removing the slot makes the
//! access an MMIO exit no device claims (the same stop), and refusing truncation is not
//! possible for files other users hold (seals are memfd-only). The job's SIGBUS, as Linux
//! gives it, is the guest kernel's: clowderd tells an LWK which tail of the region went away
//! and the LWK unmaps it, so these zero pages only answer a touch that races that message.
//! The registry of such mappings is per process, keyed by host address, because neither the
//! vCPU loop nor the watcher holds the VM's memory lock.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::{Arc, Mutex};

use clowder_api::vmm::MAX_PIECES;
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};
use vmm_config::Backing;

use crate::arch::layout::PAGE_SIZE;
use crate::arch::memmap::GuestLayout;

#[derive(Debug)]
pub enum MemoryError {
    Memfd(io::Error),
    Map(String),
    Kvm(kvm_ioctls::Error),
    /// A region request that does not fit (alignment, overlap, unknown slot...).
    BadRegion(String),
}

impl std::fmt::Display for MemoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryError::Memfd(e) => write!(f, "creating guest memory: {e}"),
            MemoryError::Map(e) => write!(f, "mapping guest memory: {e}"),
            MemoryError::Kvm(e) => write!(f, "registering guest memory with KVM: {e}"),
            MemoryError::BadRegion(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for MemoryError {}

/// A piece of a guest-physical range, named by a file descriptor the VMM holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRun {
    pub fd: RawFd,
    pub offset: u64,
    pub len: u64,
}

/// Whether the guest may write a run-time region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionAccess {
    ReadWrite,
    /// For words another VM's kernel keeps (XEMEM's count of page-table changes): the guest
    /// reads them at memory speed and cannot change them.
    ReadOnly,
}

/// A region added at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    pub slot: u32,
    pub gpa: u64,
    pub len: u64,
}

/// `len` bytes of a region's file from `file_offset`, at `at` bytes into the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RegionPiece {
    at: u64,
    file_offset: u64,
    len: u64,
}

struct RuntimeRegion {
    info: RegionInfo,
    file: File,
    /// Where the file's bytes lie in the region, in order of `at`, end to end.
    pieces: Arc<[RegionPiece]>,
    host_addr: *mut u8,
    /// The whole mapping `host_addr` lies in: larger than the region where the file maps only
    /// in larger pages (`add_region`).
    mapping: (*mut libc::c_void, usize),
}

// SAFETY: the raw pointer is a private mapping owned by this struct; nothing else aliases it
// mutably.
unsafe impl Send for RuntimeRegion {}

impl Drop for RuntimeRegion {
    fn drop(&mut self) {
        // Forgotten first, under the registry's lock: a vCPU must never cover a freed range.
        let mut mapped = MAPPED_FILES.lock().unwrap();
        mapped.retain(|m| m.host_addr != self.host_addr as usize);
        // SAFETY: the mapping this region created; KVM no longer uses it.
        unsafe { libc::munmap(self.mapping.0, self.mapping.1) };
    }
}

/// The page size of a file on hugetlbfs, which maps only in whole pages of it; `None` for
/// any other file.
fn hugetlb_page_size(file: &File) -> Option<u64> {
    // SAFETY: a plain C struct, filled by fstatfs below.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs into a local buffer, on a descriptor the caller owns.
    let hugetlb = unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } == 0 && fs.f_type == libc::HUGETLBFS_MAGIC;
    hugetlb.then_some(fs.f_bsize as u64)
}

/// A run-time region's mapping of a file, as [`cover_truncated_files`] needs it.
struct MappedFile {
    host_addr: usize,
    fd: RawFd,
    pieces: Arc<[RegionPiece]>,
    prot: libc::c_int,
    /// Where the last of the pieces ends in the file.
    file_end: u64,
    /// The file's bytes below this offset are still mapped from it (the rest covered).
    backed_to: u64,
}

/// Every run-time region's file mapping in this process (module comment: why per process).
static MAPPED_FILES: Mutex<Vec<MappedFile>> = Mutex::new(Vec::new());

/// Starts, once per process, the thread that covers truncated files' tails every second
/// (module comment: PVM retries the guest's access inside `KVM_RUN` instead of failing it).
fn watch_for_truncation() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let watch = || loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            for line in cover_truncated_files().unwrap_or_default() {
                log::warn!("{line}");
            }
        };
        if let Err(e) = std::thread::Builder::new().name("truncation-watch".into()).spawn(watch) {
            log::warn!("no watch for files truncated under the guest's regions: {e}");
        }
    });
}

/// Replaces the pages of every run-time region that now lie past its file's end with private
/// zero pages, so the guest's access that made `KVM_RUN` fail with `EFAULT` can be retried.
/// Returns one line per file covered now, or `None` when no region lies past its file's end
/// (the `EFAULT` is something else). Another vCPU may have covered the tail a moment before:
/// then the lines are empty but the access can be retried.
pub fn cover_truncated_files() -> Option<Vec<String>> {
    let mut covered = Vec::new();
    let mut mapped_files = MAPPED_FILES.lock().unwrap();
    for mapped in mapped_files.iter_mut() {
        // SAFETY: a plain C struct, filled by fstat below.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat into a local buffer, on a descriptor the region owns while registered.
        if unsafe { libc::fstat(mapped.fd, &mut stat) } != 0 {
            continue;
        }
        let end = (stat.st_size as u64).next_multiple_of(PAGE_SIZE);
        if end >= mapped.backed_to {
            continue;
        }
        let mut all_covered = true;
        for piece in mapped.pieces.iter() {
            let (from, to) = (piece.file_offset.max(end), (piece.file_offset + piece.len).min(mapped.backed_to));
            if from >= to {
                continue;
            }
            let start = mapped.host_addr + (piece.at + from - piece.file_offset) as usize;
            // SAFETY: replaces part of the region's own live mapping (registered, so not yet
            // unmapped); KVM drops its view of the old pages through its MMU notifier.
            let zeros = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    (to - from) as usize,
                    mapped.prot,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            all_covered &= zeros != libc::MAP_FAILED;
        }
        if !all_covered {
            continue;
        }
        mapped.backed_to = end;
        let name = std::fs::read_link(format!("/proc/self/fd/{}", mapped.fd)).map(|p| p.display().to_string());
        covered.push(format!(
            "{} was truncated to {} bytes under the guest's mapping: its pages past the end read as zeros from now on",
            name.unwrap_or_else(|_| "a mapped file".into()),
            stat.st_size
        ));
    }
    mapped_files.iter().any(|m| m.backed_to < m.file_end).then_some(covered)
}

/// The protection of a region's mapping.
fn prot(access: RegionAccess) -> libc::c_int {
    match access {
        RegionAccess::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        RegionAccess::ReadOnly => libc::PROT_READ,
    }
}

/// The VMM's own copy of a caller's descriptor.
fn duplicate(fd: RawFd) -> Result<File, MemoryError> {
    // SAFETY: dup of a caller-provided descriptor; the VMM keeps its own copy.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(MemoryError::BadRegion(format!("region file descriptor {fd}: {}", io::Error::last_os_error())));
    }
    // SAFETY: dup is a fresh descriptor owned by this File.
    Ok(unsafe { File::from_raw_fd(dup) })
}

/// The highest guest-physical address a run-time region may reach (46 bits: what every x86-64
/// with EPT/NPT supports; KVM rejects slots beyond the CPU's own limit anyway).
const MAX_GPA: u64 = 1 << 46;

pub struct GuestMemory {
    memfd: Arc<File>,
    layout: GuestLayout,
    mmap: GuestMemoryMmap,
    ram_slots: u32,
    regions: Vec<RuntimeRegion>,
    /// The slot numbers never used yet start here; `freed_slots` holds removed regions' numbers,
    /// reused lowest first: KVM takes numbers below its slot count only (32764 on x86), and a
    /// VM that attaches and detaches all its life would otherwise run out of them.
    next_slot: u32,
    freed_slots: BTreeSet<u32>,
}

fn memfd_create(name: &str, backing: Backing) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).expect("no NUL in memfd name");
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if backing == Backing::Huge2M {
        flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
    }
    // SAFETY: plain syscall with a valid C string.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Starts the lines that report how much guest RAM is populated, while it takes long: one
/// about every [`POPULATE_REPORT_INTERVAL`], then one when all is done. A program that starts
/// the VMM (the node daemon) reads them as a sign of progress.
pub const POPULATE_PROGRESS: &str = "clowder-vmm: guest RAM populated: ";
pub const POPULATE_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Populated at a time between looks at the clock.
const POPULATE_CHUNK: usize = 64 << 20;

/// Allocates every page of guest RAM before the guest runs (a guest must never find the host
/// out of memory), in chunks, saying on stderr how far it got while it takes long.
struct Populate {
    total: u64,
    done: u64,
    started: std::time::Instant,
    reported: Option<std::time::Instant>,
}

impl Populate {
    fn new(total: u64) -> Populate {
        Populate { total, done: 0, started: std::time::Instant::now(), reported: None }
    }

    fn region(&mut self, base: *mut u8, size: usize) -> Result<(), MemoryError> {
        let mut offset = 0;
        while offset < size {
            let len = POPULATE_CHUNK.min(size - offset);
            // SAFETY: `base..base+size` is a live shared mapping of the memfd; populating it
            // only allocates and maps its pages.
            if unsafe { libc::madvise(base.add(offset).cast(), len, libc::MADV_POPULATE_WRITE) } != 0 {
                let error = io::Error::last_os_error();
                return Err(MemoryError::Map(format!("allocating guest RAM at {} of {} MiB: {error}", self.done >> 20, self.total >> 20)));
            }
            offset += len;
            self.done += len as u64;
            let since = self.reported.unwrap_or(self.started).elapsed();
            if since >= POPULATE_REPORT_INTERVAL || (self.done == self.total && self.reported.is_some()) {
                eprintln!(
                    "{POPULATE_PROGRESS}{} of {} MiB in {:.1} s",
                    self.done >> 20,
                    self.total >> 20,
                    self.started.elapsed().as_secs_f64()
                );
                self.reported = Some(std::time::Instant::now());
            }
        }
        Ok(())
    }
}

impl GuestMemory {
    /// Creates the memfd, sizes and seals it, maps and populates it, and registers the RAM with KVM.
    pub fn new(vm: &VmFd, layout: GuestLayout, backing: Backing) -> Result<Self, MemoryError> {
        let memfd = memfd_create("clowder-guest-ram", backing).map_err(MemoryError::Memfd)?;
        memfd.set_len(layout.ram_size()).map_err(MemoryError::Memfd)?;
        // A client holding the memfd must not be able to shrink it under the VMM (SIGBUS here).
        // SAFETY: fcntl on a descriptor we own.
        let sealed = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) };
        if sealed < 0 {
            return Err(MemoryError::Memfd(io::Error::last_os_error()));
        }
        let memfd = Arc::new(memfd);
        let mut regions = Vec::new();
        for range in layout.ram_ranges() {
            let file_offset = FileOffset::from_arc(memfd.clone(), range.file_offset);
            let mapping = MmapRegionBuilder::new(range.size as usize)
                .with_file_offset(file_offset)
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_SHARED)
                .with_hugetlbfs(backing == Backing::Huge2M)
                .build()
                .map_err(|e| MemoryError::Map(e.to_string()))?;
            let region = GuestRegionMmap::new(mapping, GuestAddress(range.gpa))
                .ok_or_else(|| MemoryError::Map("region wraps the address space".into()))?;
            regions.push(region);
        }
        let mut populate = Populate::new(layout.ram_size());
        for region in &regions {
            populate.region(region.as_ptr(), region.size())?;
        }
        let mmap = GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Map(e.to_string()))?;
        let mut memory = GuestMemory { memfd, ram_slots: 0, layout, mmap, regions: Vec::new(), next_slot: 0, freed_slots: BTreeSet::new() };
        for range in memory.layout.ram_ranges().collect::<Vec<_>>() {
            let host = memory.host_address(range.gpa, range.size).expect("RAM is mapped");
            memory.register_slot(vm, memory.next_slot, range.gpa, range.size, host, RegionAccess::ReadWrite)?;
            memory.next_slot += 1;
            memory.ram_slots += 1;
        }
        Ok(memory)
    }

    fn register_slot(&self, vm: &VmFd, slot: u32, gpa: u64, len: u64, host: *mut u8, access: RegionAccess) -> Result<(), MemoryError> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: match access {
                RegionAccess::ReadWrite => 0,
                RegionAccess::ReadOnly => kvm_bindings::KVM_MEM_READONLY,
            },
            guest_phys_addr: gpa,
            memory_size: len,
            userspace_addr: host as u64,
        };
        // SAFETY: `host..host+len` is a live mapping owned by this GuestMemory for as long as the
        // slot exists (RAM lives as long as the VM; run-time regions are unregistered before
        // their mapping is dropped).
        unsafe { vm.set_user_memory_region(region) }.map_err(MemoryError::Kvm)
    }

    pub fn layout(&self) -> &GuestLayout {
        &self.layout
    }

    /// For loaders and devices that use vm-memory's `Bytes` interface.
    pub fn guest_memory(&self) -> &GuestMemoryMmap {
        &self.mmap
    }

    /// The VM's RAM memfd (shared with the channel client and the XEMEM broker).
    pub fn memfd(&self) -> &File {
        &self.memfd
    }

    /// Host address of `[gpa, gpa+len)` if it lies inside one RAM range.
    pub fn host_address(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let range = self.layout.ram_ranges().find(|r| gpa >= r.gpa && gpa - r.gpa < r.size)?;
        if len > range.size - (gpa - range.gpa) {
            return None;
        }
        use vm_memory::GuestMemoryBackend;
        self.mmap.get_host_address(GuestAddress(gpa)).ok()
    }

    /// Maps `len` bytes of `fd` from `file_offset` at guest-physical `gpa` (or the lowest free
    /// page-aligned address above RAM and other regions when `gpa` is `None`) as a new memory
    /// slot. A read-only region's writes exit as MMIO writes no device claims: the VM fails.
    pub fn add_region(
        &mut self,
        vm: &VmFd,
        fd: RawFd,
        file_offset: u64,
        len: u64,
        gpa: Option<u64>,
        access: RegionAccess,
    ) -> Result<RegionInfo, MemoryError> {
        let bad = |m: String| Err(MemoryError::BadRegion(m));
        if len == 0 || len % PAGE_SIZE != 0 || file_offset % PAGE_SIZE != 0 {
            return bad(format!("region length {len:#x} and file offset {file_offset:#x} must be non-zero multiples of 4 KiB"));
        }
        let gpa = self.place(gpa, len)?;
        let file = duplicate(fd)?;
        // A file on larger pages (another enclave's hugetlb RAM, which XEMEM attaches in 4 KiB
        // runs) maps only in whole pages of its size: map the pages the range lies in and give
        // the guest's slot only the range, so it sees nothing of the neighbouring memory.
        let unit = hugetlb_page_size(&file).unwrap_or(PAGE_SIZE);
        let map_offset = file_offset - file_offset % unit;
        let Some(map_len) = file_offset.checked_add(len).and_then(|end| end.checked_next_multiple_of(unit)).map(|end| end - map_offset)
        else {
            return bad(format!("region file range {file_offset:#x}+{len:#x} wraps"));
        };
        // SAFETY: a fresh shared mapping of the file; checked for failure below.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len as usize,
                prot(access),
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                map_offset as libc::off_t,
            )
        };
        if mapping == libc::MAP_FAILED {
            return bad(format!("mapping region file at {file_offset:#x}+{len:#x}: {}", io::Error::last_os_error()));
        }
        // SAFETY: file_offset - map_offset < unit <= map_len: inside the mapping.
        let host = unsafe { mapping.cast::<u8>().add((file_offset - map_offset) as usize) };
        let pieces = Arc::from([RegionPiece { at: 0, file_offset, len }]);
        self.register_region(vm, file, gpa, pieces, host, (mapping, map_len as usize), access)
    }

    /// Maps `pieces` (offset, length) of `fd`, in order and end to end, at guest-physical
    /// `gpa` (chosen as for [`GuestMemory::add_region`] when `None`) as ONE memory slot: an
    /// owner's scattered frames (a VM's 4 KiB pages of its RAM) reach the guest as one
    /// contiguous range, not a slot each (KVM has 32764, and adding each costs the VMM a
    /// request and KVM a slot update). The pieces are mapped side by side in one reserved
    /// host range. On a file on larger pages every piece must be whole pages of it.
    pub fn add_pieces(
        &mut self,
        vm: &VmFd,
        fd: RawFd,
        pieces: &[(u64, u64)],
        gpa: Option<u64>,
        access: RegionAccess,
    ) -> Result<RegionInfo, MemoryError> {
        let bad = |m: String| Err(MemoryError::BadRegion(m));
        if pieces.is_empty() || pieces.len() > MAX_PIECES {
            return bad(format!("a region is made of 1 to {MAX_PIECES} pieces, not {}", pieces.len()));
        }
        let file = duplicate(fd)?;
        let unit = hugetlb_page_size(&file).unwrap_or(PAGE_SIZE);
        let mut placed = Vec::with_capacity(pieces.len());
        let mut len: u64 = 0;
        for (index, &(file_offset, piece_len)) in pieces.iter().enumerate() {
            if piece_len == 0 || piece_len % unit != 0 || file_offset % unit != 0 {
                return bad(format!(
                    "piece {index} ({file_offset:#x}+{piece_len:#x}): offset and length must be non-zero multiples of the file's \
                     {unit:#x}-byte pages"
                ));
            }
            if file_offset.checked_add(piece_len).is_none_or(|end| end > i64::MAX as u64) {
                return bad(format!("piece {index} ({file_offset:#x}+{piece_len:#x}) lies beyond any file"));
            }
            placed.push(RegionPiece { at: len, file_offset, len: piece_len });
            len = len
                .checked_add(piece_len)
                .filter(|len| *len <= MAX_GPA)
                .ok_or_else(|| MemoryError::BadRegion("the pieces add up to more than the guest-physical address space".into()))?;
        }
        let gpa = self.place(gpa, len)?;
        // One reservation, a unit larger so that a file on larger pages maps at its alignment.
        let reserved = (len + unit - PAGE_SIZE) as usize;
        // SAFETY: a fresh inaccessible anonymous mapping, only reserving the address range.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return bad(format!("reserving {len:#x} bytes of address space for a region: {}", io::Error::last_os_error()));
        }
        let host = (mapping as u64).next_multiple_of(unit) as *mut u8;
        for (index, piece) in placed.iter().enumerate() {
            // SAFETY: replaces part of the reservation just made (host + at + len lies inside
            // it) with a shared mapping of the file; checked for failure below.
            let mapped = unsafe {
                libc::mmap(
                    host.add(piece.at as usize).cast(),
                    piece.len as usize,
                    prot(access),
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    file.as_raw_fd(),
                    piece.file_offset as libc::off_t,
                )
            };
            if mapped == libc::MAP_FAILED {
                let error = io::Error::last_os_error();
                // SAFETY: the reservation made above, with every piece mapped into it so far.
                unsafe { libc::munmap(mapping, reserved) };
                let hint = if error.raw_os_error() == Some(libc::ENOMEM) {
                    " (each piece is a mapping of its own: see the host's vm.max_map_count)"
                } else {
                    ""
                };
                return bad(format!(
                    "mapping piece {index} of {} ({:#x}+{:#x}): {error}{hint}",
                    placed.len(),
                    piece.file_offset,
                    piece.len
                ));
            }
        }
        let populate = match access {
            RegionAccess::ReadWrite => libc::MADV_POPULATE_WRITE,
            RegionAccess::ReadOnly => libc::MADV_POPULATE_READ,
        };
        // All pieces at once (MAP_POPULATE on each took 200 ms for 32768 pages, this 165 ms);
        // as with MAP_POPULATE, a page that cannot be had (past the file's end) is left to the
        // guest's touch.
        // SAFETY: populates the pieces just mapped, `len` bytes at `host`.
        unsafe { libc::madvise(host.cast(), len as usize, populate) };
        self.register_region(vm, file, gpa, Arc::from(placed), host, (mapping, reserved), access)
    }

    /// Where a new region of `len` bytes goes: at `gpa` if given, else at [`Self::free_gpa`];
    /// checked against guest-physical space, RAM and the other regions.
    fn place(&self, gpa: Option<u64>, len: u64) -> Result<u64, MemoryError> {
        let bad = |m: String| Err(MemoryError::BadRegion(m));
        let gpa = gpa.unwrap_or_else(|| self.free_gpa(len));
        if gpa % PAGE_SIZE != 0 {
            return bad(format!("region address {gpa:#x} is not 4 KiB aligned"));
        }
        let end = gpa.checked_add(len).filter(|e| *e <= MAX_GPA);
        let Some(end) = end else {
            return bad(format!("region {gpa:#x}+{len:#x} ends beyond guest-physical address space"));
        };
        if gpa < self.regions_floor() {
            return bad(format!(
                "region {gpa:#x}..{end:#x} overlaps guest RAM or the MMIO hole (regions start at {:#x})",
                self.regions_floor()
            ));
        }
        if let Some(r) = self.regions.iter().find(|r| gpa < r.info.gpa + r.info.len && r.info.gpa < end) {
            return bad(format!("region {gpa:#x}..{end:#x} overlaps region slot {}", r.info.slot));
        }
        Ok(gpa)
    }

    /// Gives the guest a region mapped at `host` (within `mapping`, which it now owns) as a
    /// new slot, and watches its file for truncation.
    #[allow(clippy::too_many_arguments)]
    fn register_region(
        &mut self,
        vm: &VmFd,
        file: File,
        gpa: u64,
        pieces: Arc<[RegionPiece]>,
        host: *mut u8,
        mapping: (*mut libc::c_void, usize),
        access: RegionAccess,
    ) -> Result<RegionInfo, MemoryError> {
        let last = pieces.last().expect("a region has a piece");
        let len = last.at + last.len;
        let file_end = pieces.iter().map(|p| p.file_offset + p.len).max().unwrap_or(0);
        MAPPED_FILES.lock().unwrap().push(MappedFile {
            host_addr: host as usize,
            fd: file.as_raw_fd(),
            pieces: pieces.clone(),
            prot: prot(access),
            file_end,
            backed_to: file_end,
        });
        watch_for_truncation();
        let slot = self.freed_slots.first().copied().unwrap_or(self.next_slot);
        // Dropped (unmapped, forgotten by the watcher) if KVM refuses the slot.
        let region = RuntimeRegion { info: RegionInfo { slot, gpa, len }, file, pieces, host_addr: host, mapping };
        self.register_slot(vm, slot, gpa, len, region.host_addr, access)?;
        if !self.freed_slots.remove(&slot) {
            self.next_slot += 1;
        }
        let info = region.info.clone();
        self.regions.push(region);
        Ok(info)
    }

    /// Run-time regions live above all RAM and above the MMIO hole.
    fn regions_floor(&self) -> u64 {
        self.layout.ram_end().max(crate::arch::layout::MMIO_HOLE_END)
    }

    /// The lowest address above every region, aligned to 2 MiB so the guest can map the new
    /// region with large pages.
    /// Where a region of `len` bytes goes: above every other, 2 MiB-aligned, and 1 GiB-aligned
    /// when it is a GiB or more, so the guest can map it with pages of that size (one table
    /// entry per GiB: a guest kernel whose every instruction is emulated writes 512 times fewer).
    fn free_gpa(&self, len: u64) -> u64 {
        let align: u64 = if len >= 1 << 30 { 1 << 30 } else { 2 << 20 };
        let top = self.regions.iter().map(|r| r.info.gpa + r.info.len).fold(self.regions_floor(), u64::max);
        top.div_ceil(align) * align
    }

    /// Removes a region added with `add_region`; the guest loses access at once.
    pub fn remove_region(&mut self, vm: &VmFd, slot: u32) -> Result<RegionInfo, MemoryError> {
        let Some(index) = self.regions.iter().position(|r| r.info.slot == slot) else {
            return Err(MemoryError::BadRegion(format!("no run-time region in slot {slot}")));
        };
        let region = &self.regions[index];
        let remove = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: region.info.gpa,
            memory_size: 0,
            userspace_addr: region.host_addr as u64,
        };
        // SAFETY: size 0 deletes the slot; the mapping is dropped only after KVM let go of it.
        unsafe { vm.set_user_memory_region(remove) }.map_err(MemoryError::Kvm)?;
        self.freed_slots.insert(slot);
        Ok(self.regions.remove(index).info.clone())
    }

    pub fn regions(&self) -> Vec<RegionInfo> {
        self.regions.iter().map(|r| r.info.clone()).collect()
    }

    /// Host address of a run-time region's mapping (for tests and the XEMEM broker).
    pub fn region_host_address(&self, slot: u32) -> Option<*mut u8> {
        self.regions.iter().find(|r| r.info.slot == slot).map(|r| r.host_addr)
    }

    /// Splits `[gpa, gpa+len)` into runs of (file, offset, length). Fails if any byte of the range
    /// is not backed by RAM or a run-time region.
    pub fn translate(&self, gpa: u64, len: u64) -> Result<Vec<FileRun>, MemoryError> {
        let mut runs: Vec<FileRun> = Vec::new();
        let mut cursor = gpa;
        let end = gpa.checked_add(len).ok_or_else(|| MemoryError::BadRegion(format!("range {gpa:#x}+{len:#x} wraps")))?;
        while cursor < end {
            let ram = self
                .layout
                .ram_ranges()
                .find(|r| cursor >= r.gpa && cursor < r.gpa + r.size)
                .map(|r| (self.memfd.as_raw_fd(), r.gpa, r.size, r.file_offset));
            let piece = ram.or_else(|| {
                let region = self.regions.iter().find(|r| cursor >= r.info.gpa && cursor < r.info.gpa + r.info.len)?;
                let at = cursor - region.info.gpa;
                let piece = region.pieces[region.pieces.partition_point(|p| p.at + p.len <= at)];
                Some((region.file.as_raw_fd(), region.info.gpa + piece.at, piece.len, piece.file_offset))
            });
            let Some((fd, base, size, file_offset)) = piece else {
                return Err(MemoryError::BadRegion(format!("guest-physical address {cursor:#x} is not backed by memory")));
            };
            let take = (base + size).min(end) - cursor;
            let offset = file_offset + (cursor - base);
            match runs.last_mut() {
                Some(last) if last.fd == fd && last.offset + last.len == offset => last.len += take,
                _ => runs.push(FileRun { fd, offset, len: take }),
            }
            cursor += take;
        }
        Ok(runs)
    }

    pub fn ram_slots(&self) -> u32 {
        self.ram_slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    const PAGE: u64 = PAGE_SIZE;

    /// A VM with the smallest RAM, nothing running: enough to add and remove regions.
    fn memory() -> Option<(VmFd, GuestMemory)> {
        if !std::path::Path::new("/dev/kvm").exists() {
            eprintln!("skipped: /dev/kvm is absent on this machine");
            return None;
        }
        let vm = kvm_ioctls::Kvm::new().unwrap().create_vm().unwrap();
        let layout = GuestLayout::new(crate::arch::layout::MIN_RAM, 0).unwrap();
        let memory = GuestMemory::new(&vm, layout, Backing::Page4K).unwrap();
        Some((vm, memory))
    }

    /// A memfd of `pages` pages, each filled with its own number.
    fn numbered_pages(pages: u64) -> File {
        let file = memfd_create("clowder-pieces-test", Backing::Page4K).unwrap();
        for page in 0..pages {
            file.write_all_at(&vec![page as u8 + 1; PAGE as usize], page * PAGE).unwrap();
        }
        file
    }

    /// The page numbers the region in `slot` shows, one per page.
    fn pages_seen(memory: &GuestMemory, slot: u32, len: u64) -> Vec<u8> {
        let host = memory.region_host_address(slot).unwrap();
        // SAFETY: the region maps `len` bytes at `host` while it exists.
        (0..len / PAGE).map(|page| unsafe { host.add((page * PAGE + 100) as usize).read_volatile() }.wrapping_sub(1)).collect()
    }

    #[test]
    fn scattered_pieces_of_a_file_become_one_slot_each_at_its_place() {
        let Some((vm, mut memory)) = memory() else { return };
        let file = numbered_pages(64);
        let pieces = [(5 * PAGE, PAGE), (0, 2 * PAGE), (40 * PAGE, 3 * PAGE), (7 * PAGE, PAGE), (5 * PAGE, PAGE)];
        let slots_before = memory.regions().len();
        let region = memory.add_pieces(&vm, file.as_raw_fd(), &pieces, None, RegionAccess::ReadWrite).unwrap();
        assert_eq!(region.len, 8 * PAGE);
        assert_eq!(memory.regions().len(), slots_before + 1, "one slot for all pieces");
        assert_eq!(pages_seen(&memory, region.slot, region.len), vec![5, 0, 1, 40, 41, 42, 7, 5]);
        // The guest's writes reach the file, at the piece's place in it.
        let host = memory.region_host_address(region.slot).unwrap();
        // SAFETY: page 3 of the region (page 40 of the file) is mapped read-write.
        unsafe { host.add(3 * PAGE as usize).write_volatile(0xee) };
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, 40 * PAGE).unwrap();
        assert_eq!(byte, [0xee]);
        // Translation gives the pieces back, from the middle of one to the middle of another.
        let runs = memory.translate(region.gpa + PAGE + 8, 4 * PAGE).unwrap();
        let found: Vec<(u64, u64)> = runs.iter().map(|r| (r.offset, r.len)).collect();
        assert_eq!(found, vec![(8, 2 * PAGE - 8), (40 * PAGE, 2 * PAGE + 8)]);
        assert!(runs.iter().all(|r| r.fd == runs[0].fd));
        memory.remove_region(&vm, region.slot).unwrap();
        assert_eq!(memory.regions().len(), slots_before);
    }

    #[test]
    fn removed_regions_slot_numbers_are_used_again() {
        let Some((vm, mut memory)) = memory() else { return };
        let file = numbered_pages(1);
        let add = |memory: &mut GuestMemory| memory.add_region(&vm, file.as_raw_fd(), 0, PAGE, None, RegionAccess::ReadWrite).unwrap().slot;
        let (first, second) = (add(&mut memory), add(&mut memory));
        memory.remove_region(&vm, first).unwrap();
        assert_eq!(add(&mut memory), first, "the lowest free number first");
        // More attachments in a VM's life than KVM has slot numbers (32764 on x86).
        for round in 0..33_000 {
            let slot = add(&mut memory);
            assert_eq!(slot, second + 1, "round {round}");
            memory.remove_region(&vm, slot).unwrap();
        }
    }

    #[test]
    fn bad_pieces_are_refused_and_leave_no_region() {
        let Some((vm, mut memory)) = memory() else { return };
        let file = numbered_pages(4);
        let too_many = vec![(0, PAGE); MAX_PIECES + 1];
        for (pieces, why) in [
            (&[][..], "1 to"),
            (&[(0, PAGE), (100, PAGE)][..], "piece 1"),
            (&[(0, PAGE), (PAGE, 0)][..], "piece 1"),
            (&[(0, PAGE + 1)][..], "piece 0"),
            (&[(u64::MAX - PAGE + 1, PAGE)][..], "beyond any file"),
            (&[(1 << 62, 1 << 62)][..], "beyond any file"),
            (&too_many[..], "1 to"),
        ] {
            let refused = memory.add_pieces(&vm, file.as_raw_fd(), pieces, None, RegionAccess::ReadWrite).unwrap_err();
            assert!(refused.to_string().contains(why), "{} pieces: {refused}", pieces.len());
        }
        // Pieces that add up past guest-physical space, a misplaced address, a descriptor that
        // is no file.
        let huge = vec![(0, 1 << 40); 100];
        let refused = memory.add_pieces(&vm, file.as_raw_fd(), &huge, None, RegionAccess::ReadWrite).unwrap_err();
        assert!(refused.to_string().contains("address space"), "{refused}");
        let refused = memory.add_pieces(&vm, file.as_raw_fd(), &[(0, PAGE)], Some(0), RegionAccess::ReadWrite).unwrap_err();
        assert!(refused.to_string().contains("overlaps guest RAM"), "{refused}");
        assert!(memory.add_pieces(&vm, -1, &[(0, PAGE)], None, RegionAccess::ReadWrite).is_err());
        // A file opened read-only cannot be mapped for writing: nothing stays mapped.
        let read_only = File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
        let refused = memory.add_pieces(&vm, read_only.as_raw_fd(), &[(0, PAGE), (PAGE, PAGE)], None, RegionAccess::ReadWrite).unwrap_err();
        assert!(refused.to_string().contains("mapping piece 0 of 2"), "{refused}");
        assert!(memory.regions().is_empty());
        // Read-only, it maps.
        let region = memory.add_pieces(&vm, read_only.as_raw_fd(), &[(PAGE, PAGE), (0, PAGE)], None, RegionAccess::ReadOnly).unwrap();
        assert_eq!(pages_seen(&memory, region.slot, region.len), vec![1, 0]);
    }

    #[test]
    fn a_truncated_files_pieces_past_its_end_read_as_zeros() {
        let Some((vm, mut memory)) = memory() else { return };
        let file = numbered_pages(16);
        let pieces = [(12 * PAGE, PAGE), (2 * PAGE, PAGE), (9 * PAGE, 2 * PAGE)];
        let region = memory.add_pieces(&vm, file.as_raw_fd(), &pieces, None, RegionAccess::ReadWrite).unwrap();
        file.set_len(10 * PAGE).unwrap();
        let lines = cover_truncated_files().expect("a region lies past its file's end");
        assert!(lines.iter().any(|line| line.contains("truncated to 40960 bytes")), "{lines:?}");
        // Pages 12 and 10 of the file are gone (zeros, read back as 0 - 1); 2 and 9 stay.
        assert_eq!(pages_seen(&memory, region.slot, region.len), vec![255, 2, 9, 255]);
        memory.remove_region(&vm, region.slot).unwrap();
    }
}
