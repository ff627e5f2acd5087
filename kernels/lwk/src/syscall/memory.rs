//! Memory: mmap, munmap, mprotect, mremap, madvise, brk, over the job's eagerly mapped
//! regions (`crate::job::memory`). Flags, against Linux's: mmap takes MAP_SHARED or
//! MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED and MAP_FIXED_NOREPLACE, and ignores the rest
//! (MAP_POPULATE, MAP_NORESERVE, ...: memory is always resident); PROT_READ, PROT_WRITE and
//! PROT_EXEC (others EINVAL); mremap takes MREMAP_MAYMOVE only (MREMAP_FIXED and others are
//! EINVAL); madvise accepts every advice and acts on MADV_DONTNEED only.

use super::{Errno, Fd, SyscallResult};
use crate::arch::paging::Protection;
use crate::console::log;
use crate::enclave::files;
use crate::job;
use crate::job::descriptors::Descriptor;
use crate::job::memory::{Access, JobMemory, MemoryError, READ_WRITE};
use crate::job::shared;
use crate::linux_consts;

linux_consts!(u32: PROT_READ, PROT_WRITE, PROT_EXEC, MAP_SHARED, MAP_FIXED, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE, MREMAP_MAYMOVE; i32: MADV_DONTNEED);

/// Runs `change` on the calling process's memory, then clears what it handed out still
/// holding old data (`JobMemory::take_uncleared`) once the process table is let go: large runs
/// wait for the host (`enclave::zero_memory`), which clears them at native speed.
fn with_memory<R>(change: impl FnOnce(&mut JobMemory) -> R) -> R {
    let (result, uncleared) = job::with_process(|process| (change(&mut process.memory), process.memory.take_uncleared()));
    for (physical, len) in uncleared {
        crate::enclave::zero_memory(physical, len);
    }
    result
}

fn memory_error(error: MemoryError) -> Errno {
    match error {
        MemoryError::NoMemory => Errno::ENOMEM,
        MemoryError::InvalidArgument => Errno::EINVAL,
    }
}

/// PROT_* bits as page rights (x86 pages are always readable once present).
fn access_of(protection: u32) -> Result<Access, Errno> {
    if protection & !(PROT_READ | PROT_WRITE | PROT_EXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    Ok((protection != 0).then_some(Protection { write: protection & PROT_WRITE != 0, execute: protection & PROT_EXEC != 0 }))
}

/// A file mapping: a private copy of the file's bytes from `offset` (zero past its end) in
/// heap memory, from the job's archive or, for a host file, written there by the host; a
/// shared mapping of a host file maps the file's own pages (`map_host_file_shared`).
fn map_file(fd: Fd, len: u64, protection: u32, flags: u32, offset: u64, fixed: Option<u64>) -> SyscallResult {
    enum Source {
        Archive(crate::fs::Node),
        Host(u32),
    }
    let source = job::with_process(|process| match process.descriptors.get(fd).as_deref() {
        Some(Descriptor::File { node, .. }) => Ok(Source::Archive(*node)),
        Some(Descriptor::Remote { handle, .. }) => Ok(Source::Host(*handle)),
        Some(_) => Err(Errno::ENODEV),
        None => Err(Errno::EBADF),
    })?;
    let access = access_of(protection)?;
    if let (Source::Host(handle), true) = (&source, flags & MAP_SHARED != 0) {
        return map_host_file_shared(*handle, len, access, offset, fixed);
    }
    if flags & MAP_SHARED != 0 && protection & PROT_WRITE != 0 {
        return Err(Errno::EACCES); // a copy: writes could not reach the file
    }
    let (start, zeroed) = with_memory(|memory| memory.map_for_file(len, fixed)).map_err(memory_error)?;
    let filled = match source {
        Source::Archive(node) => {
            let contents = node.contents();
            let from = (offset as usize).min(contents.len());
            let count = (len as usize).min(contents.len() - from);
            job::with_process(|process| process.memory.fill_heap(start, &contents[from..from + count]));
            count as u64
        }
        // Without the process table's lock while the host works: the memory is this
        // process's until this thread, alive in the kernel, lets it go.
        Source::Host(handle) => {
            let physical = job::with_process(|process| process.memory.heap_physical(start));
            let count = files::read_into_memory(handle, physical, len, offset);
            if count < 0 {
                let _ = job::with_process(|process| process.memory.unmap(start, len));
                return files::to_syscall_result(count);
            }
            count as u64
        }
    };
    job::with_process(|process| {
        if !zeroed && filled < len {
            process.memory.clear_heap_range(start + filled, len.next_multiple_of(4096) - filled);
        }
        if access != Some(READ_WRITE) {
            process.memory.protect(start, len, access)?;
        }
        Ok(start)
    })
    .map_err(memory_error)
}

/// mmap(addr, length, prot, flags, fd, offset): memory from the job's heap. Anonymous
/// mappings start zeroed; shared ones get a block of their own that forked children map too
/// (`job::shared`; MAP_FIXED only within its window, mremap EINVAL); file mappings (private, or shared read-only:
/// files cannot change), of the job's archive or of the host, are filled with a copy of the
/// file at `offset` (zero past its end).
/// Mappings go top-down from below the stack, as in Linux's default layout; the address is a
/// hint except with MAP_FIXED or MAP_FIXED_NOREPLACE (EEXIST over anything in use), which
/// must fall in that window, above what the break holds.
pub fn mmap(address: u64, len: usize, protection: u32, flags: u32, fd: Fd, offset: u64) -> SyscallResult {
    if !offset.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    let len = len as u64;
    let fixed = (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0).then_some(address);
    // As Linux (4.17 on): without MAP_FIXED, a range that is partly in use is EEXIST.
    if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) == MAP_FIXED_NOREPLACE
        && job::with_process(|process| {
            process.memory.overlaps_use(address, len) || process.shared.overlaps(address, address.saturating_add(len))
        })
    {
        return Err(Errno::EEXIST);
    }
    if flags & MAP_ANONYMOUS == 0 {
        return map_file(fd, len, protection, flags, offset, fixed);
    }
    let access = access_of(protection)?;
    if flags & MAP_SHARED != 0 {
        return map_shared(len, access, fixed);
    }
    with_memory(|memory| memory.map_anonymous(len, access, fixed)).map_err(memory_error)
}

/// Shared anonymous memory (`job::shared`): a block of its own that forked children map too.
fn map_shared(len: u64, access: Access, fixed: Option<u64>) -> SyscallResult {
    if fixed.is_some_and(|start| !shared::in_window(start, start.saturating_add(len))) {
        log!(
            "mmap: MAP_SHARED | MAP_ANONYMOUS at a fixed address outside {:#x}..{:#x} is not supported",
            shared::WINDOW_START,
            shared::WINDOW_END
        );
        return Err(Errno::EINVAL);
    }
    let (start, released) =
        job::with_process(|process| process.shared.map_new(&mut process.memory.aspace, len, access, fixed)).map_err(memory_error)?;
    drop(released);
    Ok(start)
}

/// A shared mapping of host file `handle` from `offset`: the file's own pages, which the host
/// adds to the enclave as a region (`job::shared`).
fn map_host_file_shared(handle: u32, len: u64, access: Access, offset: u64, fixed: Option<u64>) -> SyscallResult {
    if fixed.is_some_and(|start| !shared::in_window(start, start.saturating_add(len))) {
        log!(
            "mmap: MAP_SHARED of a host file at a fixed address outside {:#x}..{:#x} is not supported",
            shared::WINDOW_START,
            shared::WINDOW_END
        );
        return Err(Errno::EINVAL);
    }
    let len = len.checked_next_multiple_of(4096).filter(|&len| len != 0).ok_or(Errno::EINVAL)?;
    let writable = access.is_some_and(|protection| protection.write);
    let gpa = files::map_shared(handle, offset, len, writable);
    if gpa < 0 {
        return files::to_syscall_result(gpa);
    }
    let (start, released) =
        job::with_process(|process| process.shared.map_host_file(&mut process.memory.aspace, gpa as u64, len, access, fixed))
            .map_err(memory_error)?;
    drop(released);
    Ok(start)
}

/// `[address, address + len)` in the shared window, as an end-checked range.
fn shared_range(address: u64, len: usize) -> Option<(u64, u64)> {
    let end = address.checked_add((len as u64).next_multiple_of(4096))?;
    shared::in_window(address, end).then_some((address, end))
}

/// munmap(addr, len): the pages disappear; heap memory is cleared and reused by later
/// `mmap`s.
pub fn munmap(address: u64, len: usize) -> SyscallResult {
    if let Some((start, end)) = shared_range(address, len) {
        if !address.is_multiple_of(4096) || len == 0 {
            return Err(Errno::EINVAL);
        }
        let (from, to) = (start.max(shared::WINDOW_START), end.min(shared::WINDOW_END));
        let released = job::with_process(|process| process.shared.unmap(&mut process.memory.aspace, from, to)).map_err(memory_error)?;
        // Other CPUs may cache the pages, which another process may get once the block goes.
        crate::sched::shoot_down_user_tlbs();
        drop(released);
        if (from, to) == (start, end) {
            return Ok(0);
        }
    }
    job::with_process(|process| process.memory.unmap(address, len as u64)).map(|_| 0).map_err(|_| Errno::EINVAL)
}

/// mprotect(addr, len, prot) on any mapped part of the job (image, stack, heap).
pub fn mprotect(address: u64, len: usize, protection: u32) -> SyscallResult {
    let access = access_of(protection)?;
    if let Some((start, end)) = shared_range(address, len) {
        if !address.is_multiple_of(4096) {
            return Err(Errno::EINVAL);
        }
        return job::with_process(|process| process.shared.protect(&mut process.memory.aspace, start, end, access))
            .map(|_| 0)
            .map_err(memory_error);
    }
    job::with_process(|process| process.memory.protect(address, len as u64, access)).map(|_| 0).map_err(memory_error)
}

/// mremap(old, old_len, new_len, flags): heap mappings shrink, grow in place, or move with
/// MREMAP_MAYMOVE.
pub fn mremap(address: u64, old_len: usize, new_len: usize, flags: u32) -> SyscallResult {
    if flags & !MREMAP_MAYMOVE != 0 {
        return Err(Errno::EINVAL);
    }
    if shared_range(address, old_len).is_some() {
        log!("mremap of shared anonymous memory is not supported");
        return Err(Errno::EINVAL);
    }
    with_memory(|memory| memory.remap(address, old_len as u64, new_len as u64, flags & MREMAP_MAYMOVE != 0)).map_err(memory_error)
}

/// madvise(addr, len, advice): memory is always resident and never paged, so advice is
/// accepted and ignored, except MADV_DONTNEED, after which anonymous memory reads as zero.
pub fn madvise(address: u64, len: usize, advice: i32) -> SyscallResult {
    if !address.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    if advice == MADV_DONTNEED {
        with_memory(|memory| memory.discard(address, len as u64));
    }
    Ok(0)
}

/// brk(addr): moves the break inside the heap reserved at load; returns the new (or, if it
/// cannot move, the old) break, as Linux does.
pub fn brk(address: u64) -> SyscallResult {
    Ok(with_memory(|memory| memory.set_brk(address)))
}
