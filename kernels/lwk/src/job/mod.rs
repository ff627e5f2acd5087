//! The job: one static Linux executable, loaded from PVH module 0 with all of its memory
//! reserved and mapped up front, then run in user mode until it exits or faults. It is the
//! job's first process (pid 1); the processes it forks live in the same table (`PROCESSES`),
//! and `execve` loads their new images with the same loader. The job ends when its first
//! process does.

pub mod descriptors;
pub mod elf;
pub mod epoll;
pub mod memory;
pub mod pipe;
pub mod shared;
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
use crate::linux::Errno;
use crate::machine;
use crate::mm::aspace::AddressSpace;
use crate::mm::pmem;
use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use elf::{Executable, PF_W, PF_X};
use memory::{JobMemory, Region, READ_WRITE};

/// The stack ends here, 2 MiB aligned, a little below the top of user space as on Linux.
pub const STACK_TOP: u64 = 0x0000_7fff_ffe0_0000;
/// The id of the first process (and its main thread) of a job whose launching client has host
/// pid `launcher` (0: none): that pid, where Linux could give it and no process of the enclave
/// has it (the enclave numbers its own from above Linux's pids, `lwk_core::ids`). Ranks in different enclaves and on the host thus never share a
/// pid (Open MPI's shared memory takes a segment whose creator has the caller's pid for the
/// caller's own), and a peer's pid names a live host process while the job runs (UCX reads
/// its `/proc/PID/stat` to see that the peer lives).
fn leader_pid(launcher: u64) -> Option<u64> {
    ((2..lwk_core::ids::FIRST_KERNEL_ID).contains(&launcher) && !crate::process::exists(launcher)).then_some(launcher)
}
/// What the first process's default heap leaves at least to the kernel and the job's other
/// processes: a quarter of the free memory, and never less than this.
const KERNEL_RESERVE: u64 = 16 << 20;
/// A process image `execve` loads gets, unless the job set a heap size, an eighth of the free
/// memory within these bounds.
const EXEC_HEAP_MIN: u64 = 4 << 20;
const EXEC_HEAP_MAX: u64 = 64 << 20;

pub struct Process {
    pub memory: JobMemory,
    pub descriptors: descriptors::Descriptors,
    /// Its `MAP_SHARED | MAP_ANONYMOUS` mappings, which its forked children share.
    pub shared: shared::SharedMappings,
    /// argv[0], what `/proc/self/exe` resolves to.
    pub executable_path: String,
}

/// The live processes by pid (a process leaves the table when its last thread ends).
static PROCESSES: SpinLock<BTreeMap<u64, Process>> = SpinLock::new(BTreeMap::new());
/// Kept in the fast calls' data page, which computes the job's CPU time from it too.
static JOB_START_NS: &AtomicU64 = &crate::arch::fastcall::DATA.job_start_ns;
static VERBOSE: AtomicBool = AtomicBool::new(false);
/// The job's heap size (0: none given) and stack size, for images `execve` loads.
static HEAP_OPTION: AtomicU64 = AtomicU64::new(0);
static STACK_OPTION: AtomicU64 = AtomicU64::new(0);

/// Is there a job (for code that runs between jobs too, like the enclave's XEMEM node)?
pub fn is_loaded() -> bool {
    !PROCESSES.lock().is_empty()
}

/// Runs `f` on the calling thread's process. A thread whose process has already ended (a
/// kill raced with its creation or its wake-up) ends here without touching it, as it would
/// at its next return to user mode: its process must not take the kernel down with it.
/// Only for a thread of the job: the service loop has no process of its own (the CPU's pid is
/// that of the thread it last ran) and uses [`with_process_of`].
pub fn with_process<R>(f: impl FnOnce(&mut Process) -> R) -> R {
    let pid = crate::sched::current_pid();
    let mut processes = PROCESSES.lock();
    match processes.get_mut(&pid) {
        Some(process) => f(process),
        None => {
            drop(processes);
            log!("a thread of process {pid}, which has ended, ends");
            crate::sched::exit_current(0)
        }
    }
}

/// Runs `f` on process `pid`, if it is alive (for code that serves a process from outside its
/// threads, like `/dev/xpmem` answering the host for the job's first process).
pub fn with_process_of<R>(pid: u64, f: impl FnOnce(&mut Process) -> R) -> Option<R> {
    PROCESSES.lock().get_mut(&pid).map(f)
}

/// Whether process `pid` of the job is alive (has not ended).
pub fn process_exists(pid: u64) -> bool {
    PROCESSES.lock().contains_key(&pid)
}

/// The pipe end behind `descriptor` of the calling process, if it is one (a handle of its own,
/// so that the caller may wait without holding any lock), and whether it is non-blocking.
pub fn pipe_end(descriptor: descriptors::Fd) -> Option<(pipe::PipeEnd, bool)> {
    with_process(|process| match process.descriptors.get(descriptor).as_deref() {
        Some(descriptors::Descriptor::Pipe(end)) => Some((end.share(), end.non_blocking)),
        _ => None,
    })
}

/// Adds a forked process to the table.
pub fn add_process(pid: u64, process: Process) {
    PROCESSES.lock().insert(pid, process);
}

/// Takes process `pid` out of the table (it ended).
pub fn take_process(pid: u64) -> Option<Process> {
    PROCESSES.lock().remove(&pid)
}

/// The host truncated a file under a shared mapping: guest-physical `[gpa, gpa + len)`, a
/// tail of its region, went away (`HostMessage::SharedFileTruncated`). Every process mapping
/// it loses those pages (`shared`), so its next touch there is SIGBUS. Whether any was mapped.
pub fn host_file_truncated(gpa: u64, len: u64) -> bool {
    let unmapped = PROCESSES
        .lock()
        .values_mut()
        .fold(false, |unmapped, process| process.shared.host_file_truncated(&mut process.memory.aspace, gpa, len) | unmapped);
    if unmapped {
        crate::sched::shoot_down_user_tlbs();
    }
    unmapped
}

/// Whether a fault of the calling thread at `address` is a touch past the end of a host file
/// it maps shared (SIGBUS, not SIGSEGV).
pub fn is_past_shared_file_end(address: u64) -> bool {
    shared::in_window(address, address.saturating_add(1)) && with_process(|process| process.shared.is_past_file_end(address))
}

#[derive(Debug)]
pub enum LoadError {
    NoModule,
    BadArchive,
    NotInArchive(String),
    Elf(elf::ElfError),
    /// The program's interpreter (PT_INTERP) is not a file of the job's.
    MissingInterpreter(String),
    /// The host refused the interpreter (`EACCES`: no execute bit, not a regular file).
    InterpreterRefused(String, Errno),
    BadInterpreter(String, elf::ElfError),
    NoMemory(&'static str),
    OverlapsStack,
    StackSetup,
}

/// What the host and the console are told when a job cannot start.
impl core::fmt::Display for LoadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LoadError::NoModule => f.write_str("no job was given to the kernel"),
            LoadError::BadArchive => f.write_str("the job's file archive is malformed"),
            LoadError::NotInArchive(path) => write!(f, "{path} is not a file of the job's archive"),
            LoadError::Elf(error) => write!(f, "the program {error}"),
            // As a Linux shell says it (bash 5.2) when execve finds no interpreter.
            LoadError::MissingInterpreter(path) => write!(f, "cannot execute: required file not found (the interpreter {path})"),
            LoadError::InterpreterRefused(path, errno) => {
                write!(f, "the program's interpreter {path} cannot be executed (errno {})", errno.0)
            }
            LoadError::BadInterpreter(path, error) => write!(f, "the program's interpreter {path} {error}"),
            LoadError::NoMemory(what) => write!(f, "the enclave has no memory left for the job's {what}"),
            LoadError::OverlapsStack => f.write_str("the program's segments overlap the stack's place"),
            LoadError::StackSetup => f.write_str("the arguments and environment do not fit on the stack"),
        }
    }
}

impl LoadError {
    /// The status a Linux shell gives a command that fails so: 127 when a file it needs is
    /// missing (execve's ENOENT), 126 when it cannot be executed.
    pub fn status(&self) -> u8 {
        match self {
            LoadError::NotInArchive(_) | LoadError::MissingInterpreter(_) => 127,
            _ => machine::CANNOT_START_STATUS,
        }
    }
}

/// A file the loader maps: its bytes and the guest-physical address they sit at.
#[derive(Clone, Copy)]
pub struct LoadFile<'a> {
    pub bytes: &'a [u8],
    pub physical: u64,
}

/// Who loads a program, which decides where an interpreter missing from the job's own files
/// may come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Loader {
    /// The enclave starting a job's first process, outside any thread of the job: there is no
    /// process to ask the host in the name of, so clowderd sends the interpreter with the job
    /// and nothing else is looked up (a program whose headers clowderd read differently gets
    /// `MissingInterpreter`, never a file read as another job's user).
    JobStart,
    /// `execve` in a thread of the job: the host is asked as that process's user.
    Execve,
}

/// The program `file` and, when it names one, its interpreter (a file of the job's file
/// system), placed just above the program's last page.
struct Program<'a> {
    executable: Executable,
    file: LoadFile<'a>,
    interpreter: Option<(Executable, LoadFile<'a>)>,
    /// AT_BASE: the interpreter's load bias (0 without one).
    interpreter_base: u64,
}

impl<'a> Program<'a> {
    fn parse(file: LoadFile<'a>, loader: Loader) -> Result<Program<'a>, LoadError> {
        let executable = Executable::parse(file.bytes).map_err(LoadError::Elf)?;
        let Some(path) = executable.interpreter.clone() else {
            return Ok(Program { executable, file, interpreter: None, interpreter_base: 0 });
        };
        let own_file = fs::normalize("/", &path)
            .and_then(|normalized| fs::lookup(&normalized))
            .filter(|node| !node.is_directory())
            .map(|node| LoadFile { bytes: node.contents(), physical: node.physical });
        // Else the host's, as its user sees it (a program `execve` read from the host).
        let interpreter_file = match own_file {
            Some(file) => file,
            None if loader == Loader::JobStart => return Err(LoadError::MissingInterpreter(path)),
            None => host_executable(&path).map(|(_, file)| file).map_err(|errno| match errno {
                Errno::ENOENT => LoadError::MissingInterpreter(path.clone()),
                refused => LoadError::InterpreterRefused(path.clone(), refused),
            })?,
        };
        let interpreter =
            Executable::parse_interpreter(interpreter_file.bytes).map_err(|error| LoadError::BadInterpreter(path.clone(), error))?;
        let (start, _) = interpreter.span();
        let bias = if interpreter.relocatable {
            let base = executable.span().1.next_multiple_of(interpreter.alignment);
            base - start / interpreter.alignment * interpreter.alignment
        } else {
            0
        };
        let interpreter = interpreter.placed_at(bias).map_err(|error| LoadError::BadInterpreter(path.clone(), error))?;
        let (program_start, program_end) = executable.span();
        let (start, end) = interpreter.span();
        if start < program_end && end > program_start {
            return Err(LoadError::BadInterpreter(path, elf::ElfError::MalformedLoadableSegment));
        }
        Ok(Program { executable, file, interpreter: Some((interpreter, interpreter_file)), interpreter_base: bias })
    }

    /// Every loadable segment with the file it comes from.
    fn segments(&self) -> Vec<(&elf::Segment, LoadFile<'a>)> {
        let program = self.executable.segments.iter().map(|segment| (segment, self.file));
        let interpreter =
            self.interpreter.iter().flat_map(|(interpreter, file)| interpreter.segments.iter().map(|segment| (segment, *file)));
        program.chain(interpreter).collect()
    }

    /// Where the new image starts running: the interpreter's entry, else the program's.
    fn entry(&self) -> u64 {
        self.interpreter.as_ref().map_or(self.executable.entry, |(interpreter, _)| interpreter.entry)
    }
}

fn allocate_region(start: u64, size: u64, what: &'static str) -> Result<Region, LoadError> {
    let physical_start = pmem::allocate(size, HUGE_PAGE_SIZE).ok_or(LoadError::NoMemory(what))?;
    Ok(Region { start, end: start + size, physical_start })
}

fn protection_of(flags: u32) -> Protection {
    Protection { write: flags & PF_W != 0, execute: flags & PF_X != 0 }
}

/// Maps the PT_LOAD segments (the program's and its interpreter's), each page with its
/// rights (the union of the segments touching it). Pages of read-only segments map the
/// file's own pages when the file sits at a page-compatible physical address (a bare
/// executable module does; Kitten does the same): copying is emulated kernel work on PVM, a
/// few ms per 100 KiB. Other pages are copies in one contiguous block. Returns the image
/// region and the physical page behind each page.
fn load_image(segments: &[(&elf::Segment, LoadFile<'_>)], aspace: &mut AddressSpace) -> Result<(Region, Vec<u64>), LoadError> {
    let start = segments.iter().map(|(s, _)| s.address).min().unwrap_or(0) / PAGE_SIZE * PAGE_SIZE;
    let end = segments.iter().map(|(s, _)| s.address + s.memory_size).max().unwrap_or(0).next_multiple_of(PAGE_SIZE);
    let region = allocate_region(start, end - start, "executable image")?;
    let pages = ((end - start) / PAGE_SIZE) as usize;
    let block_page = |page: usize| region.physical_start + page as u64 * PAGE_SIZE;
    // Per page: segment flags (0: no segment, unmapped) and the file page it can share, if any.
    let mut page_flags = vec![0u32; pages];
    let mut shared_file_page: Vec<Option<u64>> = vec![None; pages];
    for (segment, file) in segments {
        let first = ((segment.address - start) / PAGE_SIZE) as usize;
        let last = ((segment.address + segment.memory_size - start).div_ceil(PAGE_SIZE)) as usize;
        let file_start = file.physical + segment.file_offset;
        let shareable =
            segment.flags & PF_W == 0 && segment.memory_size == segment.file_size && file_start % PAGE_SIZE == segment.address % PAGE_SIZE;
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
    for (segment, file) in segments {
        let mut address = segment.address;
        let file_end = segment.address + segment.file_size;
        while address < file_end {
            let page = ((address - start) / PAGE_SIZE) as usize;
            let chunk_end = file_end.min((address / PAGE_SIZE + 1) * PAGE_SIZE);
            if shared_file_page[page].is_none() {
                let offset = (segment.file_offset + (address - segment.address)) as usize;
                phys::bytes_mut(region.physical_start + (address - start), (chunk_end - address) as usize)
                    .copy_from_slice(&file.bytes[offset..offset + (chunk_end - address) as usize]);
            }
            address = chunk_end;
        }
    }
    let physical_pages: Vec<u64> = (0..pages).map(|page| shared_file_page[page].unwrap_or_else(|| block_page(page))).collect();
    let mut page = 0;
    while page < pages {
        let flags = page_flags[page];
        let mut run_end = page + 1;
        while run_end < pages
            && page_flags[run_end] == flags
            && physical_pages[run_end] == physical_pages[page] + (run_end - page) as u64 * PAGE_SIZE
        {
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

/// Whether `file` can be loaded by `execve` as far as its headers and its interpreter tell
/// (before it lets go of anything).
pub fn check_program(file: LoadFile<'_>) -> Result<(), LoadError> {
    Program::parse(file, Loader::Execve).map(|_| ())
}

/// A process image: its memory, with the initial stack built, and where it starts.
pub struct Image {
    pub memory: JobMemory,
    pub entry: TrapFrame,
}

/// Loads the executable `file` (`path` in the job's file system: AT_EXECFN), with its
/// interpreter if it is dynamically linked (looked up as `loader` may), into a new address space with its initial stack,
/// and leaves that address space loaded on this CPU. The heap is `heap_size` bytes (rounded up
/// to 2 MiB), or with `None` what the kernel and the job's other processes can spare once the
/// image and stack are placed (`spare_heap_size`).
pub fn load_image_memory(
    loader: Loader,
    file: LoadFile<'_>,
    path: &str,
    argv: &[String],
    env: &[String],
    heap_size: Option<u64>,
    stack_size: u64,
) -> Result<Image, LoadError> {
    let program = Program::parse(file, loader)?;
    let mut aspace = AddressSpace::new().map_err(|_| LoadError::NoMemory("page tables"))?;
    let mut blocks: Vec<Region> = Vec::new();
    let result = (|| {
        let (image, image_pages) = load_image(&program.segments(), &mut aspace)?;
        blocks.push(image);
        let stack_size = stack_size.next_multiple_of(HUGE_PAGE_SIZE);
        let stack = allocate_region(STACK_TOP - stack_size, stack_size, "stack")?;
        blocks.push(stack);
        aspace.map(stack.start, stack.physical_start, stack_size, READ_WRITE).map_err(|_| LoadError::NoMemory("page tables"))?;
        let heap_start = image.end.next_multiple_of(HUGE_PAGE_SIZE);
        // Sized only now: the image and stack may have taken part of the largest free range.
        let heap_size = heap_size.unwrap_or_else(spare_heap_size).next_multiple_of(HUGE_PAGE_SIZE);
        if heap_start + heap_size > stack.start {
            return Err(LoadError::OverlapsStack);
        }
        let heap = allocate_region(heap_start, heap_size, "heap")?;
        blocks.push(heap);
        if VERBOSE.load(Ordering::Relaxed) {
            log!(
                "job: image {:#x}..{:#x}, heap {:#x}..{:#x} ({} MiB), stack {} MiB, entry {:#x}",
                image.start,
                image.end,
                heap.start,
                heap.end,
                heap_size >> 20,
                stack_size >> 20,
                program.entry()
            );
        }
        // Without a vDSO libc falls back to system calls: slower, still correct.
        let vdso = crate::vdso::map_into(&mut aspace);
        if crate::trap::ring3_syscall_page_in_use() {
            map_ring3_syscall_page_into(&mut aspace).map_err(|_| LoadError::NoMemory("page tables"))?;
        }
        map_xstate_stub_page_into(&mut aspace).map_err(|_| LoadError::NoMemory("page tables"))?;
        aspace.activate();
        let start = stack::Start { executable: &program.executable, interpreter_base: program.interpreter_base, path, argv, env, vdso };
        let stack_pointer = stack::build(STACK_TOP, &start).map_err(|_| LoadError::StackSetup)?;
        Ok((image, image_pages, stack, heap, stack_pointer))
    })();
    match result {
        Ok((image, image_pages, stack, heap, stack_pointer)) => Ok(Image {
            memory: JobMemory::new(aspace, image, image_pages, stack, heap),
            entry: TrapFrame::new_user(program.entry(), stack_pointer),
        }),
        Err(error) => {
            // The new tables may be loaded (a failed stack build): off them before they go.
            // The caller loads the address space it runs in again.
            crate::mm::activate_kernel_tables();
            for block in blocks {
                pmem::free(block.physical_start, block.end - block.start);
            }
            aspace.free();
            Err(error)
        }
    }
}

/// The first process's default heap: what the kernel and the job's other processes can spare
/// (a quarter of the free memory, at least 16 MiB), within the largest free range. Called once
/// the image and stack hold their memory, so that the heap fits beside them.
fn spare_heap_size() -> u64 {
    let free = pmem::total_free();
    let spare = free.saturating_sub(KERNEL_RESERVE.max(free / 4));
    spare.min(pmem::largest_free_block(HUGE_PAGE_SIZE)) / HUGE_PAGE_SIZE * HUGE_PAGE_SIZE
}

/// The heap of an image `execve` loads: the job's heap size if it set one, else an eighth of
/// the free memory (4 to 64 MiB).
pub fn exec_heap_size() -> u64 {
    match HEAP_OPTION.load(Ordering::Relaxed) {
        0 => (pmem::total_free() / 8).clamp(EXEC_HEAP_MIN, EXEC_HEAP_MAX).min(pmem::largest_free_block(HUGE_PAGE_SIZE) / 2),
        size => size,
    }
}

pub fn exec_stack_size() -> u64 {
    STACK_OPTION.load(Ordering::Relaxed)
}

/// `/proc/self/exe` in an executable's path: libc asks for it, and busybox runs its applets
/// by executing it.
pub const SELF_EXE: &str = "/proc/self/exe";

/// Loads the job (enclave job `job_id`, 0 for a boot module's), alone in the machine, as
/// process `launcher` (`leader_pid`; else 1), and returns the user context to start it with.
pub fn load(module: Option<&Module>, options: &JobOptions, job_id: u32, launcher: u64) -> Result<TrapFrame, LoadError> {
    VERBOSE.store(options.verbose, Ordering::Relaxed);
    HEAP_OPTION.store(options.heap_size.unwrap_or(0), Ordering::Relaxed);
    STACK_OPTION.store(options.stack_size, Ordering::Relaxed);
    crate::process::reset();
    crate::syscall::census::reset();
    let pid = leader_pid(launcher).unwrap_or(1);
    let (entry, aspace) = load_first_process(module, options, pid, options.heap_size)?;
    crate::signal::reset(pid);
    crate::process::add_job_leader(pid, job_id);
    // Before the main thread's CPU time starts: no thread's exceeds the job's.
    let now = clock::monotonic_ns();
    JOB_START_NS.store(now, Ordering::Relaxed);
    crate::sched::init_main_thread(pid, aspace, job_id);
    if options.verbose {
        log!("job starts {} us after kernel entry", now / 1000);
    }
    Ok(entry)
}

/// Loads enclave job `job_id` beside the running ones: its first process gets a new pid and
/// its first thread goes to the least loaded CPU. The job's heap is its own size if it gave
/// one, else half of what the first process of a job alone would get, so that later jobs
/// still fit. The heap and stack sizes of images its processes `execve` are the first job's
/// (`exec_heap_size`). Returns the new process's pid.
pub fn load_beside(module: &Module, options: &JobOptions, job_id: u32, launcher: u64) -> Result<u64, LoadError> {
    let pid = match leader_pid(launcher) {
        Some(pid) => pid,
        None => crate::sched::reserve_tid().ok_or(LoadError::NoMemory("process id (every id of the enclave's block is in use)"))?,
    };
    // The loader builds the new stack in the new address space: this CPU goes back to its own.
    let loaded = crate::arch::cpu::read_cr3() & !0xfff;
    let heap = options.heap_size.unwrap_or_else(|| spare_heap_size() / 2 / HUGE_PAGE_SIZE * HUGE_PAGE_SIZE);
    let loaded_image = load_first_process(Some(module), options, pid, Some(heap));
    crate::arch::paging::activate_root(loaded);
    let (entry, aspace) = loaded_image?;
    // As for the first job (`enclave::launch_job`): LSTAR may point at the ring-3 page.
    let mapped = with_process_of(pid, |process| map_ring3_syscall_page_into(&mut process.memory.aspace).is_ok());
    if mapped != Some(true) {
        if let Some(process) = take_process(pid) {
            process.memory.release();
        }
        return Err(LoadError::NoMemory("page tables"));
    }
    crate::signal::job_leader_created(pid);
    crate::process::add_job_leader(pid, job_id);
    if let Err(error) = crate::sched::spawn_job_leader(pid, job_id, &entry, aspace) {
        crate::process::forget_job_leader(pid);
        crate::signal::process_exited(pid);
        if let Some(process) = take_process(pid) {
            process.memory.release();
        }
        return Err(match error {
            crate::sched::SpawnError::TooManyThreads => LoadError::NoMemory("thread (the enclave has its most threads)"),
            crate::sched::SpawnError::NoMemory => LoadError::NoMemory("kernel stack"),
        });
    }
    Ok(pid)
}

/// Loads the program `options.argv[0]` of `module` (an archive or the executable itself) as
/// process `pid` with `heap_size` (`None`: what the memory spares), into the process table.
/// Returns its entry and address space.
fn load_first_process(
    module: Option<&Module>,
    options: &JobOptions,
    pid: u64,
    heap_size: Option<u64>,
) -> Result<(TrapFrame, (u64, u64)), LoadError> {
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
        // The executable is a file of the job's too, for `execve` (of `/proc/self/exe`).
        if fs::normalize("/", &options.argv[0]).and_then(|path| fs::lookup(&path)).is_none() {
            fs::add_file(&options.argv[0], module.start, module.size);
        }
        (module_bytes, module.start)
    };
    // libc insists on an absolute path (glibc asserts it): the job lives at the root.
    let executable_path = if options.argv[0].starts_with('/') { options.argv[0].clone() } else { alloc::format!("/{}", options.argv[0]) };
    let file = LoadFile { bytes: file, physical: file_physical };
    let env = memory::with_allocator_defaults(&options.env);
    let image = load_image_memory(Loader::JobStart, file, &options.argv[0], &options.argv, &env, heap_size, options.stack_size)?;
    let aspace = image.memory.aspace.handle();
    let process =
        Process { memory: image.memory, descriptors: descriptors::Descriptors::new(), shared: Default::default(), executable_path };
    PROCESSES.lock().insert(pid, process);
    Ok((image.entry, aspace))
}

/// Maps the pages SYSCALL lands on when it stays in ring 3 (see `arch::fastcall`) at the top
/// of the job's address space: the code (read-only, executable), the data the kernel keeps
/// (read-only) and a scratch page of the process's own (writable).
pub fn map_ring3_syscall_page() {
    with_process(|process| map_ring3_syscall_page_into(&mut process.memory.aspace)).expect("no memory to map the system-call page");
}

pub fn map_ring3_syscall_page_into(aspace: &mut AddressSpace) -> Result<(), crate::arch::paging::OutOfMemory> {
    use crate::arch::fastcall::{code_page_physical, data_page_physical, DATA_PAGE, RING3_SYSCALL_PAGE, SCRATCH_PAGE};
    aspace.map(RING3_SYSCALL_PAGE, code_page_physical(), PAGE_SIZE, Protection { write: false, execute: true })?;
    aspace.map(DATA_PAGE, data_page_physical(), PAGE_SIZE, Protection { write: false, execute: false })?;
    aspace.map_own_page(SCRATCH_PAGE, READ_WRITE)?;
    // The process's ring-3 file calls (`enclave::slots`).
    aspace.map_own_page(enclave_proto::slots::RING3_REQUEST_PAGE, READ_WRITE)
}

/// Maps the ring-3 XSAVE stub page (`arch::fpu`, when the kernel switches vector state
/// that way): read-only, executable.
pub fn map_xstate_stub_page_into(aspace: &mut AddressSpace) -> Result<(), crate::arch::paging::OutOfMemory> {
    match crate::arch::fpu::stub_page_physical() {
        Some(physical) => aspace.map(crate::arch::fpu::STUB_PAGE, physical, PAGE_SIZE, Protection { write: false, execute: true }),
        None => Ok(()),
    }
}

/// Maps the vector state save area of context `slot`, a thread of the running process, into
/// that process (`arch::fpu`), writable: a ring-3 XSAVE stub touched it for the first time
/// there. Whether it is mapped now: not unless the process's address space is the one
/// loaded (the stub's), nor without memory for a page table.
pub fn map_save_area(slot: usize) -> bool {
    let (physical, address) = crate::arch::fpu::area_mapping(slot);
    with_loaded_process_memory(|aspace| aspace.map(address, physical, PAGE_SIZE, READ_WRITE).is_ok())
}

/// Maps the ring-3 XSAVE stub page into the running process again (it unmapped it, which only
/// `munmap` can do); whether it is mapped now, as `map_save_area`.
pub fn map_xstate_stub_page_again() -> bool {
    with_loaded_process_memory(|aspace| map_xstate_stub_page_into(aspace).is_ok())
}

/// `change` on the running process's address space, if it is the one loaded.
fn with_loaded_process_memory(change: impl FnOnce(&mut AddressSpace) -> bool) -> bool {
    with_process(|process| process.memory.aspace.handle().1 == crate::arch::cpu::read_cr3() & !0xfff && change(&mut process.memory.aspace))
}

pub fn is_verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// How long the job has run.
pub fn run_time_ns() -> u64 {
    clock::monotonic_ns() - JOB_START_NS.load(Ordering::Relaxed)
}

/// An executable or interpreter read from the host for `execve` (a persistent enclave's job:
/// paths its own file system lacks), kept until the job ends: images map its read-only pages
/// as they map the archive's, and a shell running one program many times reads it once (again
/// when the file's size or modification time has changed since).
struct HostExecutable {
    path: String,
    size: u64,
    modified: (i64, u32),
    physical: u64,
}

static HOST_EXECUTABLES: SpinLock<Vec<HostExecutable>> = SpinLock::new(Vec::new());

/// Host files larger than this are not read for `execve` (`ENOMEM`): a copy of it must fit in
/// the enclave's RAM beside the job.
fn host_executable_limit() -> u64 {
    pmem::largest_free_block(PAGE_SIZE) / 2
}

/// The host's file `path` (relative to the job's working directory, or absolute) as an
/// executable: its absolute path and its bytes, read (once) into kernel memory by the host.
/// Called by `execve` only, in a thread of the job: the host is asked as that thread's job and
/// process (the service loop has neither; see [`Loader::JobStart`]).
/// `ENOENT` where there is no host to ask or no such file; `EACCES` for what is not a regular
/// file with an execute bit (the job is root: any bit will do, as for Linux's root); the host's
/// answer when it refuses the user the file.
pub fn host_executable(path: &str) -> Result<(String, LoadFile<'static>), Errno> {
    use crate::enclave::files;
    let cwd = files::job_cwd().filter(|_| files::is_host_path(path));
    let absolute = cwd.and_then(|cwd| fs::normalize(&cwd, path)).ok_or(Errno::ENOENT)?;
    let attributes = files::stat_path(&absolute).map_err(|error| Errno((-error) as u64))?;
    const S_IFREG: u32 = 0o100000;
    if attributes.mode & fs::S_IFMT != S_IFREG || attributes.mode & 0o111 == 0 {
        return Err(Errno::EACCES);
    }
    let modified = (attributes.modified.seconds, attributes.modified.nanoseconds);
    let cached =
        HOST_EXECUTABLES.lock().iter().rev().find(|copy| copy.path == absolute).map(|copy| (copy.size, copy.modified, copy.physical));
    let physical = match cached {
        Some((size, when, physical)) if size == attributes.size && when == modified => physical,
        _ => {
            let physical = read_host_file(&absolute, attributes.size)?;
            HOST_EXECUTABLES.lock().push(HostExecutable { path: absolute.clone(), size: attributes.size, modified, physical });
            physical
        }
    };
    Ok((absolute, LoadFile { bytes: phys::bytes(physical, attributes.size as usize), physical }))
}

/// Reads the host file `path` of `size` bytes into a new page-aligned block (free memory is
/// zero, so the last page's tail is too).
fn read_host_file(path: &str, size: u64) -> Result<u64, Errno> {
    use crate::enclave::files;
    const O_RDONLY_CLOEXEC: u32 = 0o2000000;
    let block = size.max(1).next_multiple_of(PAGE_SIZE);
    if size > host_executable_limit() {
        return Err(Errno::ENOMEM);
    }
    let physical = pmem::allocate(block, PAGE_SIZE).ok_or(Errno::ENOMEM)?;
    let descriptor = files::open(path, O_RDONLY_CLOEXEC, 0);
    let read = match descriptor {
        descriptor if descriptor < 0 => descriptor,
        descriptor => {
            let fd = descriptors::Fd(descriptor as i32);
            let handle = files::remote_handle(fd);
            drop(with_process(|process| process.descriptors.remove(fd)));
            match handle {
                Some(handle) => {
                    let read = files::read_into_memory(handle, physical, size, 0);
                    files::close(handle);
                    read
                }
                None => -(Errno::EIO.0 as i64),
            }
        }
    };
    if read != size as i64 {
        // Whatever the host wrote is cleared before the block goes back.
        phys::zero(physical, block as usize);
        pmem::free_clean(physical, block);
        return Err(if read < 0 { Errno((-read) as u64) } else { Errno::EIO });
    }
    Ok(physical)
}

/// The job is over with `status` (`JobExited`'s: the exit code, or [`killed_status`]): a
/// persistent enclave reports it to the host and waits for the next job; a one-shot machine
/// logs it (the daemon reads that line) and exits with a shell's status (128 + signal).
pub fn exit(status: u32) -> ! {
    // In an enclave CPU 0 ends the job, calling this again: the job's lines are logged there once.
    if crate::enclave::is_active() && crate::arch::tables::current_cpu() != 0 {
        crate::sched::hand_job_end_to_cpu0(status)
    }
    if VERBOSE.load(Ordering::Relaxed) {
        log!("job ran {} us", run_time_ns() / 1000);
    }
    crate::syscall::census::report();
    if crate::enclave::is_active() {
        crate::enclave::end_job(status)
    }
    log!("job exited with status {status}");
    machine::exit(shell_status(status))
}

/// A shell's status for job status `status`: 128 + signal for a killed job (a machine's exit
/// status has one byte).
pub fn shell_status(status: u32) -> u8 {
    match enclave_proto::job_status_signal(status) {
        Some(signal) => 128 + signal as u8,
        None => status as u8,
    }
}

/// The job status of a job killed by `signal`, which an exit code cannot be mistaken for.
pub fn killed_status(signal: u8) -> u32 {
    enclave_proto::KILLED_BY_SIGNAL + u32::from(signal)
}

/// Memory of ended processes (or replaced images) whose XPMEM segments' removes the name
/// server did not answer: attachers elsewhere may still map it, so it is not reused while the
/// job runs. It goes back with the job's memory, once the daemon has revoked every attachment
/// of the job's segments (it does before the next job starts).
static KEPT_UNTIL_JOB_ENDS: SpinLock<Vec<(JobMemory, shared::SharedMappings)>> = SpinLock::new(Vec::new());

/// Keeps `memory` and the shared blocks the process mapped (`shared`) until the job ends.
pub fn keep_until_job_ends(memory: JobMemory, shared: shared::SharedMappings) {
    KEPT_UNTIL_JOB_ENDS.lock().push((memory, shared));
}

/// Gives the job's memory back (a persistent enclave's job ended, and no CPU uses its
/// address spaces any more): every process's memory and page tables, cleared with `zero`.
pub fn release(zero: memory::Zero) {
    let processes = core::mem::take(&mut *PROCESSES.lock());
    let kept = core::mem::take(&mut *KEPT_UNTIL_JOB_ENDS.lock());
    crate::xpmem::forget_job();
    for (_, process) in processes {
        process.memory.release_with(zero);
    }
    for (memory, shared) in kept {
        memory.release_with(zero);
        drop(shared);
    }
    for copy in core::mem::take(&mut *HOST_EXECUTABLES.lock()) {
        let block = copy.size.max(1).next_multiple_of(PAGE_SIZE);
        zero(copy.physical, block);
        pmem::free_clean(copy.physical, block);
    }
}

/// The calling thread faulted: its process dies of `signal`, the job's status says so if it
/// is the job's first process.
pub fn kill_for_fault(signal: u8, name: &str, frame: &TrapFrame) -> ! {
    log!(
        "process {} killed by {name}: vector {} error {:#x} at rip {:#x} (address {:#x}), rsp {:#x}",
        crate::sched::current_pid(),
        frame.vector,
        frame.error_code,
        frame.rip,
        crate::arch::cpu::read_cr2(),
        frame.rsp
    );
    crate::process::die_of_signal_here(signal)
}

/// The job's first process died of `signal` (its own, or sent by another process).
pub fn exit_by_signal(signal: u8) -> ! {
    log!("job killed by signal {signal}");
    exit(killed_status(signal))
}
