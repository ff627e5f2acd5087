//! What one memory slot per attachment saves: an attachment of scattered 4 KiB pages (a VM
//! owner's RAM frames, as XEMEM hands them to an attacher) mapped into a VM as one slot
//! (`GuestMemory::add_pieces`, the XEMEM PCI device's way) against a slot per page, the way whose
//! cost the XEMEM paper measured in Palacios (its red-black tree of memory regions).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use kvm_ioctls::Kvm;
use vmm::arch::{layout, memmap::GuestLayout};
use vmm::memory::GuestMemory;
use vmm::RegionAccess;
use vmm_config::Backing;

const PAGE: u64 = 4096;
/// The attachment: 128 MiB of pages, within KVM's 32764 slots if each had its own.
pub const PAGES: u64 = 32768;
/// The slot-per-page way is measured over this many pages and scaled to [`PAGES`] (adding
/// tens of thousands of slots takes minutes on PVM and leaves KVM none for the rest).
const PAGES_AS_SLOTS: u64 = 4096;

/// One round's times in milliseconds: the attachment added as one slot, that slot removed, and
/// the attachment as a slot per page (scaled).
pub struct SlotTimes {
    pub one_slot_add: f64,
    pub one_slot_remove: f64,
    pub slot_per_page_add: f64,
}

/// A file of [`PAGES`] pages on tmpfs, each starting with its own number, and the pages in an
/// order no two file neighbours share (an odd stride visits each page once).
fn scattered_file() -> (File, Vec<(u64, u64)>) {
    let path = std::env::temp_dir().join(format!("vmm-bench-slots-{}", std::process::id()));
    let file = File::options().read(true).write(true).create_new(true).open(&path).expect("scratch file");
    std::fs::remove_file(&path).expect("unlink scratch file");
    file.set_len(PAGES * PAGE).unwrap();
    for page in 0..PAGES {
        file.write_all_at(&page.to_le_bytes(), page * PAGE).unwrap();
    }
    let scattered = (0..PAGES).map(|i| ((i * 7919) % PAGES * PAGE, PAGE)).collect();
    (file, scattered)
}

/// `rounds` measurements of the same scattered attachment, each checked page by page through
/// the VMM's host view of the slot.
pub fn slot_times(rounds: usize) -> Vec<SlotTimes> {
    let vm = Kvm::new().unwrap().create_vm().unwrap();
    let mut memory = GuestMemory::new(&vm, GuestLayout::new(layout::MIN_RAM, 0).unwrap(), Backing::Page4K).unwrap();
    let (file, scattered) = scattered_file();
    let ms = |started: Instant| started.elapsed().as_secs_f64() * 1e3;
    (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let region = memory.add_pieces(&vm, file.as_raw_fd(), &scattered, None, RegionAccess::ReadWrite).unwrap();
            let one_slot_add = ms(started);
            let host = memory.region_host_address(region.slot).unwrap();
            for (index, (offset, _)) in scattered.iter().enumerate() {
                // SAFETY: the region maps PAGES pages at `host`, and stays mapped until removed below.
                let number = unsafe { host.add(index * PAGE as usize).cast::<u64>().read_volatile() };
                assert_eq!(number * PAGE, *offset, "page {index} of the slot");
            }
            let started = Instant::now();
            memory.remove_region(&vm, region.slot).unwrap();
            let one_slot_remove = ms(started);
            let started = Instant::now();
            let slots: Vec<u32> = scattered[..PAGES_AS_SLOTS as usize]
                .iter()
                .map(|&(offset, len)| memory.add_region(&vm, file.as_raw_fd(), offset, len, None, RegionAccess::ReadWrite).unwrap().slot)
                .collect();
            let slot_per_page_add = ms(started) * (PAGES / PAGES_AS_SLOTS) as f64;
            for slot in slots {
                memory.remove_region(&vm, slot).unwrap();
            }
            SlotTimes { one_slot_add, one_slot_remove, slot_per_page_add }
        })
        .collect()
}
