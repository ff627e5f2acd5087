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

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::{Arc, Mutex};

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

struct RuntimeRegion {
    info: RegionInfo,
    file: File,
    file_offset: u64,
    host_addr: *mut u8,
    /// The whole mapping `host_addr` lies in: larger than the region where the file maps only
    /// in larger pages (`add_region`).
    mapping: (*mut libc::c_void, usize),
}

// The raw pointer is a private mapping owned by this struct; nothing else aliases it mutably.
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
    len: u64,
    fd: RawFd,
    file_offset: u64,
    prot: libc::c_int,
    /// Bytes of the mapping from its start still backed by the file (the rest covered).
    backed: u64,
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
        let end_in_mapping = (stat.st_size as u64).next_multiple_of(PAGE_SIZE).saturating_sub(mapped.file_offset).min(mapped.len);
        if end_in_mapping >= mapped.backed {
            continue;
        }
        let start = mapped.host_addr + end_in_mapping as usize;
        // SAFETY: replaces part of the region's own live mapping (registered, so not yet
        // unmapped); KVM drops its view of the old pages through its MMU notifier.
        let zeros = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                (mapped.backed - end_in_mapping) as usize,
                mapped.prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeros == libc::MAP_FAILED {
            continue;
        }
        mapped.backed = end_in_mapping;
        let name = std::fs::read_link(format!("/proc/self/fd/{}", mapped.fd)).map(|p| p.display().to_string());
        covered.push(format!(
            "{} was truncated to {} bytes under the guest's mapping: its pages past the end read as zeros from now on",
            name.unwrap_or_else(|_| "a mapped file".into()),
            stat.st_size
        ));
    }
    mapped_files.iter().any(|m| m.backed < m.len).then_some(covered)
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
    next_slot: u32,
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
        let mut memory = GuestMemory { memfd, ram_slots: 0, layout, mmap, regions: Vec::new(), next_slot: 0 };
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
        let gpa = match gpa {
            Some(g) => g,
            None => self.free_gpa(len),
        };
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
        // SAFETY: dup of a caller-provided descriptor; the VMM keeps its own copy.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return bad(format!("region file descriptor {fd}: {}", io::Error::last_os_error()));
        }
        // SAFETY: dup is a fresh descriptor owned by this File.
        let file = unsafe { File::from_raw_fd(dup) };
        let prot = match access {
            RegionAccess::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
            RegionAccess::ReadOnly => libc::PROT_READ,
        };
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
                prot,
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
        let slot = self.next_slot;
        MAPPED_FILES.lock().unwrap().push(MappedFile {
            host_addr: host as usize,
            len,
            fd: file.as_raw_fd(),
            file_offset,
            prot,
            backed: len,
        });
        watch_for_truncation();
        let region =
            RuntimeRegion { info: RegionInfo { slot, gpa, len }, file, file_offset, host_addr: host, mapping: (mapping, map_len as usize) };
        self.register_slot(vm, slot, gpa, len, region.host_addr, access)?;
        self.next_slot += 1;
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
                self.regions
                    .iter()
                    .find(|r| cursor >= r.info.gpa && cursor < r.info.gpa + r.info.len)
                    .map(|r| (r.file.as_raw_fd(), r.info.gpa, r.info.len, r.file_offset))
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
