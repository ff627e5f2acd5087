//! Memory: physical ranges (`pmem`), the kernel's page tables and address spaces (`aspace`).

pub mod aspace;
pub mod pmem;
pub mod ranges;

use crate::arch::paging::{PageTables, Protection, TableSource, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::phys::{self, KERNEL_VMA, PHYSMAP_BASE};
use crate::arch::sync::SpinLock;
use crate::arch::{heap, paging};
use crate::bootinfo::{BootInfo, E820_RAM};

/// The first MiB holds firmware and boot structures; the kernel never allocates from it.
const LOW_MEMORY_END: u64 = 1 << 20;
/// The window covers at least the low 4 GiB, so device memory (LAPIC, IOAPIC) is reachable too.
const LOW_4G: u64 = 4 << 30;

/// Page-table pages straight from `pmem` (zeroed by its invariant).
pub struct PmemTables;

impl TableSource for PmemTables {
    fn allocate_table(&mut self) -> Option<u64> {
        pmem::allocate_pages(1)
    }
}

static KERNEL_TABLES: SpinLock<Option<PageTables>> = SpinLock::new(None);

/// Builds the free-memory set from the memory map, starts the heap and switches to page
/// tables that cover all memory.
pub fn init(boot: &BootInfo) {
    let mut top_of_ram = 0;
    for range in boot.memory_map().iter().filter(|range| range.kind == E820_RAM) {
        let start = range.start.max(LOW_MEMORY_END).next_multiple_of(PAGE_SIZE);
        let end = (range.start + range.size) / PAGE_SIZE * PAGE_SIZE;
        if start < end {
            pmem::add_free(start, end);
        }
        top_of_ram = top_of_ram.max(end);
    }
    let (kernel_start, kernel_end) = phys::kernel_image();
    pmem::reserve(kernel_start, kernel_end);
    for module in boot.modules() {
        pmem::reserve(module.start / PAGE_SIZE * PAGE_SIZE, (module.start + module.size).next_multiple_of(PAGE_SIZE));
    }
    // Page tables built below must sit in the first GiB, the only part the boot tables map:
    // first-fit allocation from low memory guarantees it.
    heap::init(heap::PageSupply { allocate: pmem::allocate_pages, free: pmem::free_pages });

    let mut tables = PageTables::new(&mut PmemTables).expect("no memory for page tables");
    let window_end = top_of_ram.max(LOW_4G).next_multiple_of(HUGE_PAGE_SIZE);
    let data = Protection { write: true, execute: false };
    tables.map(PHYSMAP_BASE, 0, window_end, data, &mut PmemTables).expect("no memory for page tables");
    // The image window: everything below the end of the kernel, writable and executable (the
    // kernel is small and trusted; W^X inside it is not worth the page-table pages).
    let image_end = kernel_end.next_multiple_of(HUGE_PAGE_SIZE);
    tables.map(KERNEL_VMA, 0, image_end, Protection { write: true, execute: true }, &mut PmemTables).expect("no memory for page tables");
    tables.activate();
    paging::enable_global_pages();
    *KERNEL_TABLES.lock() = Some(tables);
}

/// A new user address-space root that shares the kernel half.
pub fn new_user_tables() -> Option<PageTables> {
    let kernel = KERNEL_TABLES.lock();
    PageTables::new_user(kernel.as_ref()?, &mut PmemTables).ok()
}
