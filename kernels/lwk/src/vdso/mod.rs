//! The vDSO: a small shared object (`vdso.c`, built by `build.rs`) mapped into every job and
//! announced with `AT_SYSINFO_EHDR`, so that libc reads the clocks in user mode. On PVM a
//! `clock_gettime` system call costs tens of microseconds of emulated kernel work; the vDSO's
//! RDTSC and a multiplication cost nanoseconds, natively.
//!
//! Layout in the job (read-only, above the stack, below the SYSCALL page):
//!
//! | address | what |
//! |---|---|
//! | `DATA_ADDRESS` | the data page the kernel fills (`VdsoData`), read-only to the job |
//! | `IMAGE_ADDRESS` | the ELF image, as it is in the file (one loadable segment from offset 0) |
//!
//! Both are shared by every job of the enclave: the image never changes and the data page
//! only describes the clock, which is the kernel's.

use crate::arch::paging::{Protection, PAGE_SIZE};
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::clock;
use crate::mm::aspace::AddressSpace;
use crate::mm::pmem;

static IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vdso.so"));

/// Where the ELF header sits in the job: `AT_SYSINFO_EHDR`.
pub const IMAGE_ADDRESS: u64 = 0x0000_7fff_fffe_d000;
/// The data page, one page below the image (the vDSO's linker script puts it there).
pub const DATA_ADDRESS: u64 = IMAGE_ADDRESS - PAGE_SIZE;
/// The image must end below the ring-3 SYSCALL page (`arch::trap::RING3_SYSCALL_PAGE`).
const IMAGE_PAGES_MAX: u64 = 2;
const _: () = assert!(IMAGE.len() as u64 <= IMAGE_PAGES_MAX * PAGE_SIZE, "the vDSO outgrew its two pages");

/// The data page's contents; `struct clowder_vdso_data` in vdso.c has the same layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VdsoData {
    pub sequence: u32,
    pub tsc_shift: u32,
    pub boot_tsc: u64,
    pub tsc_multiplier: u64,
    pub boot_realtime_ns: u64,
}

impl VdsoData {
    pub const SIZE: usize = 32;

    pub fn to_bytes(self) -> [u8; Self::SIZE] {
        let mut bytes = [0u8; Self::SIZE];
        bytes[0..4].copy_from_slice(&self.sequence.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.tsc_shift.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.boot_tsc.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.tsc_multiplier.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.boot_realtime_ns.to_le_bytes());
        bytes
    }
}

/// Physical pages: the data page, then the image's pages.
struct VdsoPages {
    data: u64,
    image: u64,
    image_pages: u64,
}

static PAGES: SpinLock<Option<VdsoPages>> = SpinLock::new(None);

/// The pages, set up on first use (after the clock is calibrated: the data page describes it).
fn pages() -> Option<(u64, u64, u64)> {
    let mut pages = PAGES.lock();
    if pages.is_none() {
        let image_pages = (IMAGE.len() as u64).div_ceil(PAGE_SIZE);
        let data = pmem::allocate_pages(1)?;
        let image = pmem::allocate_pages(image_pages)?;
        // Free memory is zero, so the tail of the last image page is too.
        phys::bytes_mut(image, IMAGE.len()).copy_from_slice(IMAGE);
        let scale = clock::tsc_scale();
        let contents = VdsoData {
            sequence: 0,
            tsc_shift: scale.shift,
            boot_tsc: scale.boot_tsc,
            tsc_multiplier: scale.multiplier,
            boot_realtime_ns: scale.boot_realtime_ns,
        };
        phys::bytes_mut(data, VdsoData::SIZE).copy_from_slice(&contents.to_bytes());
        *pages = Some(VdsoPages { data, image, image_pages });
    }
    pages.as_ref().map(|pages| (pages.data, pages.image, pages.image_pages))
}

/// Maps the data page and the image into a job's address space; returns `AT_SYSINFO_EHDR`.
pub fn map_into(aspace: &mut AddressSpace) -> Option<u64> {
    let (data, image, image_pages) = pages()?;
    let read_only = Protection { write: false, execute: false };
    let read_execute = Protection { write: false, execute: true };
    aspace.map(DATA_ADDRESS, data, PAGE_SIZE, read_only).ok()?;
    aspace.map(IMAGE_ADDRESS, image, image_pages * PAGE_SIZE, read_execute).ok()?;
    Some(IMAGE_ADDRESS)
}
