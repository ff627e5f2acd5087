//! The kernel heap behind `alloc`: power-of-two size classes from 16 bytes to 2 KiB carved
//! out of 4 KiB pages, and whole runs of pages for anything larger. Pages come from the
//! physical memory manager and are used through the physical-memory window.

use super::paging::PAGE_SIZE;
use super::phys;
use super::sync::SpinLock;
use core::alloc::{GlobalAlloc, Layout};

const SMALLEST_CLASS_SHIFT: u32 = 4;
const CLASSES: usize = 8; // 16, 32, ..., 2048

/// Where heap pages come from: `allocate(pages)` returns the physical address of a zeroed,
/// page-aligned run; `free(physical, pages)` takes one back.
pub struct PageSupply {
    pub allocate: fn(u64) -> Option<u64>,
    pub free: fn(u64, u64),
}

struct Heap {
    /// Head of each class's free list (a virtual address, 0 for empty); each free block holds
    /// the address of the next one in its first word.
    free_lists: [u64; CLASSES],
    supply: Option<PageSupply>,
}

pub struct KernelHeap(SpinLock<Heap>);

#[global_allocator]
static HEAP: KernelHeap = KernelHeap(SpinLock::new(Heap { free_lists: [0; CLASSES], supply: None }));

pub fn init(supply: PageSupply) {
    HEAP.0.lock().supply = Some(supply);
}

fn class_of(layout: &Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(1 << SMALLEST_CLASS_SHIFT);
    let class = (size.next_power_of_two().trailing_zeros() - SMALLEST_CLASS_SHIFT) as usize;
    (class < CLASSES).then_some(class)
}

fn pages_for(layout: &Layout) -> u64 {
    (layout.size() as u64).div_ceil(PAGE_SIZE)
}

// SAFETY: blocks handed out are disjoint, at least `layout.size()` long and aligned to
// `layout.align()` (classes are powers of two carved from page-aligned pages; larger
// allocations are whole pages, and alignment beyond a page is refused).
unsafe impl GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() as u64 > PAGE_SIZE {
            return core::ptr::null_mut();
        }
        let mut heap = self.0.lock();
        let Some(supply) = heap.supply.as_ref() else { return core::ptr::null_mut() };
        let allocate = supply.allocate;
        match class_of(&layout) {
            None => match allocate(pages_for(&layout)) {
                Some(physical) => phys::to_virtual(physical) as *mut u8,
                None => core::ptr::null_mut(),
            },
            Some(class) => {
                if heap.free_lists[class] == 0 {
                    let Some(page) = allocate(1) else { return core::ptr::null_mut() };
                    let block_size = 1u64 << (class as u32 + SMALLEST_CLASS_SHIFT);
                    let page = phys::to_virtual(page);
                    let mut block = page + PAGE_SIZE - block_size;
                    loop {
                        (block as *mut u64).write(heap.free_lists[class]);
                        heap.free_lists[class] = block;
                        if block == page {
                            break;
                        }
                        block -= block_size;
                    }
                }
                let block = heap.free_lists[class];
                heap.free_lists[class] = (block as *const u64).read();
                block as *mut u8
            }
        }
    }

    /// Whole pages come zeroed from the physical memory manager (it clears what is freed):
    /// clearing them again would be emulated work on PVM (about 4 ms for 64 KiB).
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { self.alloc(layout) };
        if !pointer.is_null() && class_of(&layout).is_some() {
            // SAFETY: a block of at least `layout.size()` bytes was just handed out.
            unsafe { pointer.write_bytes(0, layout.size()) };
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        let mut heap = self.0.lock();
        match class_of(&layout) {
            None => {
                if let Some(supply) = heap.supply.as_ref() {
                    (supply.free)(pointer as u64 - phys::PHYSMAP_BASE, pages_for(&layout));
                }
            }
            Some(class) => {
                (pointer as *mut u64).write(heap.free_lists[class]);
                heap.free_lists[class] = pointer as u64;
            }
        }
    }
}
