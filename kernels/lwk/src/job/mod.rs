//! The job: one static Linux executable, loaded from PVH module 0 with all of its memory
//! reserved and mapped up front, then run in user mode until it exits or faults.

pub mod descriptors;
pub mod elf;
pub mod memory;
mod stack;

pub use stack::random_bytes;

use crate::arch::paging::{Protection, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::arch::trap::TrapFrame;
use crate::bootinfo::Module;
use crate::clock;
use crate::cmdline::JobOptions;
use crate::console::log;
use crate::fs;
use crate::machine;
use crate::mm::aspace::AddressSpace;
use crate::mm::pmem;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use elf::{Executable, PF_W, PF_X};
use memory::{JobMemory, Region, READ_WRITE};

/// The stack ends here, 2 MiB aligned, a little below the top of user space as on Linux.
pub const STACK_TOP: u64 = 0x0000_7fff_ffe0_0000;
/// The job's process id (and its main thread's id): the only process of its enclave.
pub const PID: u64 = 1;
/// What the default heap leaves to the kernel (page tables, its own heap).
const KERNEL_RESERVE: u64 = 16 << 20;

pub struct Process {
    pub memory: JobMemory,
    pub descriptors: descriptors::Descriptors,
    /// argv[0], what `/proc/self/exe` resolves to.
    pub executable_path: String,
}

static PROCESS: SpinLock<Option<Process>> = SpinLock::new(None);
static JOB_START_NS: AtomicU64 = AtomicU64::new(0);
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Is there a job (for code that runs between jobs too, like the enclave's XEMEM node)?
pub fn is_loaded() -> bool {
    PROCESS.lock().is_some()
}

/// Runs `f` on the job's process (system calls and faults only happen once it exists).
pub fn with_process<R>(f: impl FnOnce(&mut Process) -> R) -> R {
    let mut process = PROCESS.lock();
    f(process.as_mut().expect("no job loaded"))
}

#[derive(Debug)]
#[allow(dead_code)] // the fields are read through `Debug` in the panic message
pub enum LoadError {
    NoModule,
    BadArchive,
    NotInArchive(String),
    Elf(elf::ElfError),
    NoMemory(&'static str),
    OverlapsStack,
    StackSetup,
}

fn allocate_region(start: u64, size: u64, what: &'static str) -> Result<Region, LoadError> {
    let physical_start = pmem::allocate(size, HUGE_PAGE_SIZE).ok_or(LoadError::NoMemory(what))?;
    Ok(Region { start, end: start + size, physical_start })
}

fn protection_of(flags: u32) -> Protection {
    Protection { write: flags & PF_W != 0, execute: flags & PF_X != 0 }
}

/// Maps the PT_LOAD segments, each page with its rights (the union of the segments touching
/// it). Pages of read-only segments map the executable's own pages when the file sits at a
/// page-compatible physical address (a bare executable module does; Kitten does the same):
/// copying is emulated kernel work on PVM, a few ms per 100 KiB. Other pages are copies in
/// one contiguous block. Returns the image region and the physical page behind each page.
fn load_image(executable: &Executable, file: &[u8], file_physical: u64, aspace: &mut AddressSpace) -> Result<(Region, Vec<u64>), LoadError> {
    let start = executable.segments.iter().map(|s| s.address).min().unwrap_or(0) / PAGE_SIZE * PAGE_SIZE;
    let end = executable.segments.iter().map(|s| s.address + s.memory_size).max().unwrap_or(0).next_multiple_of(PAGE_SIZE);
    let region = allocate_region(start, end - start, "executable image")?;
    let pages = ((end - start) / PAGE_SIZE) as usize;
    let block_page = |page: usize| region.physical_start + page as u64 * PAGE_SIZE;
    // Per page: segment flags (0: no segment, unmapped) and the file page it can share, if any.
    let mut page_flags = vec![0u32; pages];
    let mut shared_file_page: Vec<Option<u64>> = vec![None; pages];
    for segment in &executable.segments {
        let first = ((segment.address - start) / PAGE_SIZE) as usize;
        let last = ((segment.address + segment.memory_size - start).div_ceil(PAGE_SIZE)) as usize;
        let file_start = file_physical + segment.file_offset;
        let shareable = segment.flags & PF_W == 0 && segment.memory_size == segment.file_size && file_start % PAGE_SIZE == segment.address % PAGE_SIZE;
        for page in first..last {
            let page_address = start + page as u64 * PAGE_SIZE;
            // The file page holding this page's bytes (congruent, so page aligned).
            let candidate = shareable.then(|| (file_start + page_address).wrapping_sub(segment.address));
            let first_touch = page_flags[page] == 0;
            page_flags[page] |= segment.flags | elf::PF_R;
            match candidate {
                Some(file_page) if first_touch || shared_file_page[page] == Some(file_page) => shared_file_page[page] = Some(file_page),
                _ => shared_file_page[page] = None,
            }
        }
    }
    // Fill the pages that are not shared, from every segment touching them.
    for segment in &executable.segments {
        let mut address = segment.address;
        let file_end = segment.address + segment.file_size;
        while address < file_end {
            let page = ((address - start) / PAGE_SIZE) as usize;
            let chunk_end = file_end.min((address / PAGE_SIZE + 1) * PAGE_SIZE);
            if shared_file_page[page].is_none() {
                let offset = (segment.file_offset + (address - segment.address)) as usize;
                phys::bytes_mut(region.physical_start + (address - start), (chunk_end - address) as usize)
                    .copy_from_slice(&file[offset..offset + (chunk_end - address) as usize]);
            }
            address = chunk_end;
        }
    }
    let physical_pages: Vec<u64> = (0..pages).map(|page| shared_file_page[page].unwrap_or_else(|| block_page(page))).collect();
    let mut page = 0;
    while page < pages {
        let flags = page_flags[page];
        let mut run_end = page + 1;
        while run_end < pages && page_flags[run_end] == flags && physical_pages[run_end] == physical_pages[page] + (run_end - page) as u64 * PAGE_SIZE {
            run_end += 1;
        }
        if flags != 0 {
            let address = start + page as u64 * PAGE_SIZE;
            aspace
                .map(address, physical_pages[page], (run_end - page) as u64 * PAGE_SIZE, protection_of(flags))
                .map_err(|_| LoadError::NoMemory("page tables"))?;
        }
        page = run_end;
    }
    Ok((region, physical_pages))
}

/// Loads the job and returns the user context to start it with.
pub fn load(module: Option<&Module>, options: &JobOptions) -> Result<TrapFrame, LoadError> {
    let module = module.ok_or(LoadError::NoModule)?;
    let module_bytes = phys::bytes(module.start, module.size as usize);
    // An archive is the job's file system, holding the executable named by argv[0]; anything
    // else is the executable itself.
    let (file, file_physical) = if fs::is_archive(module_bytes) {
        let count = fs::load_archive(module).map_err(|_| LoadError::BadArchive)?;
        let path = fs::normalize("/", &options.argv[0]).unwrap_or_default();
        let node = fs::lookup(&path).filter(|node| !node.is_directory()).ok_or(LoadError::NotInArchive(path))?;
        if options.verbose {
            log!("job: {count} files from the archive");
        }
        (node.contents(), node.physical)
    } else {
        (module_bytes, module.start)
    };
    let executable = Executable::parse(file).map_err(LoadError::Elf)?;
    let mut aspace = AddressSpace::new().map_err(|_| LoadError::NoMemory("page tables"))?;

    let (image, image_pages) = load_image(&executable, file, file_physical, &mut aspace)?;
    let stack_size = options.stack_size.next_multiple_of(HUGE_PAGE_SIZE);
    let stack = allocate_region(STACK_TOP - stack_size, stack_size, "stack")?;
    aspace.map(stack.start, stack.physical_start, stack_size, READ_WRITE).map_err(|_| LoadError::NoMemory("page tables"))?;

    let heap_start = image.end.next_multiple_of(HUGE_PAGE_SIZE);
    let heap_size = match options.heap_size {
        Some(size) => size.next_multiple_of(HUGE_PAGE_SIZE),
        None => {
            let spare = pmem::total_free().saturating_sub(KERNEL_RESERVE);
            spare.min(pmem::largest_free().len()) / HUGE_PAGE_SIZE * HUGE_PAGE_SIZE
        }
    };
    if heap_start + heap_size > stack.start {
        return Err(LoadError::OverlapsStack);
    }
    let heap = allocate_region(heap_start, heap_size, "heap")?;
    if options.verbose {
        log!(
            "job: image {:#x}..{:#x}, heap {:#x}..{:#x} ({} MiB), stack {} MiB, entry {:#x}",
            image.start, image.end, heap.start, heap.end, heap_size >> 20, stack_size >> 20, executable.entry
        );
    }

    // Without a vDSO libc falls back to system calls: slower, still correct.
    let vdso = crate::vdso::map_into(&mut aspace);
    aspace.activate();
    let stack_pointer = stack::build(STACK_TOP, &executable, &options.argv, &options.env, vdso).map_err(|_| LoadError::StackSetup)?;
    *PROCESS.lock() = Some(Process {
        memory: JobMemory::new(aspace, image, image_pages, stack, heap),
        descriptors: descriptors::Descriptors::new(),
        // libc insists on an absolute path (glibc asserts it): the job lives at the root.
        executable_path: if options.argv[0].starts_with('/') { options.argv[0].clone() } else { alloc::format!("/{}", options.argv[0]) },
    });
    crate::signal::reset(PID);
    crate::sched::init_main_thread();
    let now = clock::monotonic_ns();
    JOB_START_NS.store(now, Ordering::Relaxed);
    VERBOSE.store(options.verbose, Ordering::Relaxed);
    if options.verbose {
        log!("job starts {} us after kernel entry", now / 1000);
    }
    Ok(TrapFrame::new_user(executable.entry, stack_pointer))
}

/// Maps the page SYSCALL lands on when it stays in ring 3 (see `arch::trap`): read-only,
/// executable, at the top of the job's address space.
pub fn map_ring3_syscall_page() {
    use crate::arch::trap::{ring3_syscall_page_physical, RING3_SYSCALL_PAGE};
    let executable = Protection { write: false, execute: true };
    with_process(|process| process.memory.aspace.map(RING3_SYSCALL_PAGE, ring3_syscall_page_physical(), PAGE_SIZE, executable))
        .expect("no memory to map the system-call page");
}

/// How long the job has run.
pub fn run_time_ns() -> u64 {
    clock::monotonic_ns() - JOB_START_NS.load(Ordering::Relaxed)
}

/// The job is over: its status becomes the VM's exit status, or, in a persistent enclave,
/// goes to the host, and the kernel waits for the next job.
pub fn exit(status: u8) -> ! {
    if VERBOSE.load(Ordering::Relaxed) {
        log!("job ran {} us", run_time_ns() / 1000);
    }
    if crate::enclave::is_active() {
        crate::enclave::end_job(status)
    }
    log!("job exited with status {status}");
    machine::exit(status)
}

/// Gives the job's memory back (a persistent enclave's job ended, and no CPU uses its
/// address space any more): the image block and the stack are cleared whole, the heap only
/// where it was used; the page tables are freed.
pub fn release() {
    let Some(process) = PROCESS.lock().take() else { return };
    crate::xpmem::forget_job();
    let mut memory = process.memory;
    let (heap_physical, heap_size) = memory.clear_heap();
    pmem::free_clean(heap_physical, heap_size);
    pmem::free(memory.stack.physical_start, memory.stack.end - memory.stack.start);
    pmem::free(memory.image.physical_start, memory.image.end - memory.image.start);
    memory.aspace.free();
}

/// The job faulted: it dies of `signal`, with the status a Linux shell reports (128 + signal).
pub fn kill_for_fault(signal: u8, name: &str, frame: &TrapFrame) -> ! {
    log!(
        "job killed by {name}: vector {} error {:#x} at rip {:#x} (address {:#x}), rsp {:#x}",
        frame.vector, frame.error_code, frame.rip, crate::arch::cpu::read_cr2(), frame.rsp
    );
    exit(128 + signal)
}

/// The job sent itself a terminating signal (abort's SIGABRT, for one).
pub fn exit_by_signal(signal: u8) -> ! {
    log!("job killed by signal {signal}");
    exit(128 + signal)
}
