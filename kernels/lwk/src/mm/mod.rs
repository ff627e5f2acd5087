//! Memory: physical ranges (`pmem`), the kernel's page tables and address spaces (`aspace`).

pub mod aspace;
pub mod pmem;
/// Sets of address ranges (pure logic, in `lwk-core`).
pub use lwk_core::ranges;

use crate::arch::paging::{LeafBlocks, PageTables, TableSource, PAGE_SIZE};
use crate::arch::phys::{self, PHYSMAP_BASE};
use crate::arch::sync::SpinLock;
use crate::arch::{heap, paging};
use crate::bootinfo::{BootInfo, E820_RAM};
use alloc::vec::Vec;

/// The first MiB holds firmware and boot structures; the kernel never allocates from it.
const LOW_MEMORY_END: u64 = 1 << 20;
/// What the boot page tables map at the physical-memory window.
const BOOT_WINDOW: u64 = 1 << 30;

/// Page-table pages: retired tables first, else fresh pages from `pmem` (zeroed by its
/// invariant).
pub struct PmemTables;

/// Unlinked page tables. Without TLB shoot-downs another CPU may still walk one, so they are
/// only ever reused as page tables of the job (a stale walk then finds the job's own
/// mappings), never returned to `pmem`.
static RETIRED_TABLES: SpinLock<Vec<u64>> = SpinLock::new(Vec::new());

impl TableSource for PmemTables {
    fn allocate_table(&mut self) -> Option<u64> {
        match RETIRED_TABLES.lock().pop() {
            Some(table) => {
                phys::zero(table, PAGE_SIZE as usize);
                Some(table)
            }
            None => pmem::allocate_pages(1),
        }
    }

    fn retire_table(&mut self, table: u64) {
        RETIRED_TABLES.lock().push(table);
    }
}

/// `PmemTables` for one address space, which records the tables it links (`owned`), so that
/// they can be freed without reading the tables.
pub struct OwnedTables<'a> {
    pub owned: &'a mut Vec<u64>,
}

impl TableSource for OwnedTables<'_> {
    fn allocate_table(&mut self) -> Option<u64> {
        let table = PmemTables.allocate_table()?;
        self.owned.push(table);
        Some(table)
    }

    fn retire_table(&mut self, table: u64) {
        if let Some(position) = self.owned.iter().position(|&owned| owned == table) {
            self.owned.swap_remove(position);
        }
        PmemTables.retire_table(table);
    }

    fn leaf_directory(&mut self, blocks: LeafBlocks) -> Option<u64> {
        leaf_directory(blocks)
    }

    fn leaf_blocks(&mut self, directory: u64) -> Option<LeafBlocks> {
        LEAF_DIRECTORIES.lock().iter().find(|(_, table)| *table == directory).map(|(blocks, _)| *blocks)
    }
}

/// How many shared directories of 2 MiB leaves are kept (see `leaf_directory`): one per GiB
/// (or part of one) that jobs map that way, such as a heap's GiBs or XEMEM attachments' regions.
const LEAF_DIRECTORIES_KEPT: usize = 16;

/// Shared directories of 2 MiB leaves by what they hold, as (blocks, table); an empty slot's
/// table is 0. They are never freed: any address space may have one linked.
static LEAF_DIRECTORIES: SpinLock<[(LeafBlocks, u64); LEAF_DIRECTORIES_KEPT]> =
    SpinLock::new([(LeafBlocks { first: 0, from: 0, to: 0 }, 0); LEAF_DIRECTORIES_KEPT]);

/// The shared directory holding `blocks`, built the first time it is asked for
/// (`TableSource::leaf_directory`); `None` once all slots hold others. An attachment of a GiB,
/// or the only one in its GiB, is then mapped, and unmapped, with one table write each.
fn leaf_directory(blocks: LeafBlocks) -> Option<u64> {
    let mut kept = LEAF_DIRECTORIES.lock();
    if let Some(&(_, table)) = kept.iter().find(|&&(held, table)| table != 0 && held == blocks) {
        return Some(table);
    }
    let slot = kept.iter_mut().find(|(_, table)| *table == 0)?;
    // A zeroed page that was never a table: the host does not track writes to it.
    let table = pmem::allocate_pages(1)?;
    paging::fill_leaf_directory(table, blocks);
    *slot = (blocks, table);
    Some(table)
}

/// Gives the retired tables back to `pmem`: called between jobs, when every CPU has loaded
/// the kernel's tables since (flushing whatever it cached of them).
pub fn free_retired_tables() {
    let retired = core::mem::take(&mut *RETIRED_TABLES.lock());
    for table in retired {
        pmem::free_pages(table, 1);
    }
}

static KERNEL_TABLES: SpinLock<Option<PageTables>> = SpinLock::new(None);
/// The end of what the physical-memory window maps (RAM, at least the boot tables' GiB).
static WINDOW_END: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(BOOT_WINDOW);

/// The end of the highest RAM range: memory the host adds at run time (XEMEM attaches of host
/// memory) must lie above it.
static RAM_END: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

pub fn ram_end() -> u64 {
    RAM_END.load(core::sync::atomic::Ordering::Relaxed)
}

/// Clears every free page, for boot loaders other than clowder-vmm: QEMU's firmware leaves
/// data in RAM the memory map calls usable (seen at the top of a 256 MiB machine), and the
/// kernel hands free memory out as zero. clowder-vmm's RAM is a fresh memfd, zero already, and
/// clearing there would be emulated kernel work (about 40 ms per MiB on PVM).
pub fn clear_free_memory() {
    pmem::for_each_free(|range| phys::zero(range.start, range.len() as usize));
}

/// Builds the free-memory set from the memory map, starts the heap and makes the physical
/// memory window cover all RAM.
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
    let (line_start, line_end) = boot.command_line_range;
    pmem::reserve(line_start / PAGE_SIZE * PAGE_SIZE, line_end.next_multiple_of(PAGE_SIZE));
    for module in boot.modules() {
        pmem::reserve(module.start / PAGE_SIZE * PAGE_SIZE, (module.start + module.size).next_multiple_of(PAGE_SIZE));
    }
    pmem::note_managed();
    heap::init(heap::PageSupply { allocate: pmem::allocate_pages, free: pmem::free_pages });

    // The boot tables map the first GiB at the window already; extend it to all RAM. Table
    // pages come from the lowest free memory, inside that first GiB, so they are reachable.
    let mut tables = PageTables::boot();
    WINDOW_END.store(top_of_ram.max(BOOT_WINDOW), core::sync::atomic::Ordering::Relaxed);
    RAM_END.store(top_of_ram, core::sync::atomic::Ordering::Relaxed);
    if top_of_ram > BOOT_WINDOW {
        tables
            .map_kernel_window(PHYSMAP_BASE + BOOT_WINDOW, BOOT_WINDOW, top_of_ram - BOOT_WINDOW, &mut PmemTables)
            .expect("no memory for page tables");
    }
    paging::enable_global_pages();
    *KERNEL_TABLES.lock() = Some(tables);
}

/// Maps one page of device registers (the xAPIC) or of a region the host added into the
/// physical-memory window, if RAM's mapping does not cover it already. Job threads may call it
/// on several CPUs at once (XEMEM attaches): the kernel half's tables change under a lock.
pub fn map_device_page(physical: u64) {
    if physical < WINDOW_END.load(core::sync::atomic::Ordering::Relaxed) {
        return;
    }
    static KERNEL_HALF: SpinLock<()> = SpinLock::new(());
    let _changing = KERNEL_HALF.lock();
    let mut tables = PageTables::boot();
    tables
        .map(PHYSMAP_BASE + physical, physical, PAGE_SIZE, crate::arch::paging::Protection { write: true, execute: false }, &mut PmemTables)
        .expect("no memory for page tables");
}

/// Runs on the kernel's own tables (no job's user half): a CPU parked between jobs, whose
/// last job's page tables may be reused.
pub fn activate_kernel_tables() {
    KERNEL_TABLES.lock().as_ref().expect("kernel tables").activate();
}

/// A new user address-space root that shares the kernel half (recorded in `owned`).
pub fn new_user_tables(owned: &mut Vec<u64>) -> Option<PageTables> {
    let kernel = KERNEL_TABLES.lock();
    PageTables::new_user(kernel.as_ref()?, &mut OwnedTables { owned }).ok()
}
