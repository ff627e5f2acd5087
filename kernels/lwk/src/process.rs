//! The job's processes: `fork` (Kitten-style: the child's memory is allocated contiguously
//! and copied at once, no copy-on-write), `execve`, exit and the parent's `wait`, process
//! groups. A job's first process (its leader: pid 1 for the first job) is the job: when it
//! ends, the job ends, whatever else of it still runs. An enclave may run several jobs at once
//! (`crate::enclave`): every process belongs to one (`Member::job`), its children to the
//! same, and signals, orphans and ends stay within the job.
//!
//! The family (`FAMILY`: parent, group, session, life) is kept apart from the processes'
//! memory and descriptors (`job::PROCESSES`) under its own lock, which is taken inside the
//! scheduler's lock when a waiting parent checks its children and is never held while taking
//! the scheduler's.

use crate::arch::phys;
use crate::arch::sync::SpinLock;
use crate::arch::trap::{TrapFrame, USER_END};
use crate::console::log;
use crate::job::{self, shared::SharedMappings, Process, SELF_EXE};
use crate::linux_consts;
use crate::sched::{self, SpawnError, WaitResult};
use crate::signal::Restart;
use crate::syscall::{user, Errno, UserAddr};
use crate::{fs, signal};
use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

linux_consts!(pub u8: SIGCHLD; u8: SIGSEGV, SIGKILL);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Life {
    /// Running; `ending` is the wait status it will report once its last thread is gone
    /// (set by `exit_group` or a fatal signal, the first one counting).
    Alive { ending: Option<u32> },
    /// Ended, not yet waited for: its wait status.
    Zombie(u32),
}

struct Member {
    parent: u64,
    group: u64,
    session: u64,
    life: Life,
    /// A `vfork` child: its parent waits until it executes a new image or ends.
    vfork_pending: bool,
    /// A forked child whose first thread does not exist yet: a kill meanwhile must leave its
    /// end to `fork`, which is about to give it a thread.
    starting: bool,
    /// Its enclave job (0: a boot module's), and whether it is that job's first process.
    job: u32,
    leads: bool,
}

static FAMILY: SpinLock<BTreeMap<u64, Member>> = SpinLock::new(BTreeMap::new());

/// Kernel addresses (never user futex words) naming what a thread waits for: a parent for its
/// children's ends, a `vfork` parent for its child.
const CHILDREN_KEY: u64 = 0xffff_f000_0000_0000;
const VFORK_KEY: u64 = 0xffff_f800_0000_0000;

fn children_key(pid: u64) -> u64 {
    CHILDREN_KEY + pid * 8
}

fn vfork_key(pid: u64) -> u64 {
    VFORK_KEY + pid * 8
}

const _: () = assert!(CHILDREN_KEY >= USER_END && VFORK_KEY >= USER_END);

/// A new job alone in the enclave: no process yet (its first comes by `add_job_leader`).
pub fn reset() {
    FAMILY.lock().clear();
}

/// Whether some process of the enclave, live or not yet waited for, has id `pid`.
pub fn exists(pid: u64) -> bool {
    FAMILY.lock().contains_key(&pid)
}

/// The first process of job `job`, leading its own group in a session outside the enclave
/// (session 0), as a program a shell starts: it may start a session of its own.
pub fn add_job_leader(first: u64, job: u32) {
    let life = Life::Alive { ending: None };
    let member = Member { parent: 0, group: first, session: 0, life, vfork_pending: false, starting: false, job, leads: true };
    FAMILY.lock().insert(first, member);
}

/// A job leader that could not start after all.
pub fn forget_job_leader(first: u64) {
    FAMILY.lock().remove(&first);
}

/// Whether process `pid` leads its job.
fn leads_job(pid: u64) -> bool {
    FAMILY.lock().get(&pid).is_some_and(|member| member.leads)
}

/// The live processes of job `job`.
fn live_members(family: &BTreeMap<u64, Member>, job: u32) -> impl Iterator<Item = u64> + '_ {
    family.iter().filter(move |(_, member)| member.job == job && matches!(member.life, Life::Alive { .. })).map(|(&pid, _)| pid)
}

/// The job status (`JobExited`'s) of wait status `status`: the exit code, or the signal.
fn job_status(status: u32) -> u32 {
    match status & 0x7f {
        0 => (status >> 8) & 0xff,
        signal => crate::job::killed_status(signal as u8),
    }
}

/// The leader of a job is ending with wait `status`. Alone in the enclave, its job ends as a
/// job always has (`job::exit`: everything goes at once, without returning). Beside other
/// jobs only its own job goes: its other processes are killed, and the leader ends as any
/// process; the job's end is reported when its last process is gone (`end_process`).
fn leader_ending(pid: u64, status: u32) {
    let job = FAMILY.lock().get(&pid).map_or(0, |member| member.job);
    if !crate::enclave::other_jobs_run(job) {
        job::exit(job_status(status))
    }
    record_ending(pid, status);
    crate::enclave::job_ending(job, job_status(status));
    kill_job(job, Some(pid), killed(SIGKILL));
}

/// Every live process of job `job` but `spare` ends with wait `status` (each at its threads'
/// next return to user mode): the job's leader ended, or the host killed the job. Looks again
/// until no new process shows up: one forked meanwhile by a victim is a victim too (one
/// forked after the last look finds its parent ending in `fork`).
pub fn kill_job(job: u32, spare: Option<u64>, status: u32) {
    let mut killed: Vec<u64> = spare.into_iter().collect();
    loop {
        let victims: Vec<u64> = live_members(&FAMILY.lock(), job).filter(|pid| !killed.contains(pid)).collect();
        if victims.is_empty() {
            return;
        }
        for pid in victims {
            killed.push(pid);
            record_ending(pid, status);
            end_threads(pid);
        }
    }
}

/// Process `pid`, whose ending is recorded, loses its threads (the last one ends it); one
/// with none ends here, unless `fork` is still giving it its first.
fn end_threads(pid: u64) {
    let starting = || FAMILY.lock().get(&pid).is_some_and(|member| member.starting);
    if sched::doom_process(pid, None) == 0 && !sched::has_threads(pid) && !starting() {
        end_process(pid, 0);
    }
}

/// The host kills job `job` with `signal` while other jobs run (`crate::enclave`).
pub fn kill_job_by_signal(job: u32, signal: u8) {
    let leader = FAMILY.lock().iter().find(|(_, member)| member.job == job && member.leads).map(|(&pid, _)| pid);
    if let Some(leader) = leader {
        record_ending(leader, killed(signal));
        crate::enclave::job_ending(job, job_status(killed(signal)));
    }
    kill_job(job, None, killed(signal));
}

/// Wait statuses as Linux encodes them.
fn exited(code: u8) -> u32 {
    (code as u32) << 8
}

fn killed(signal: u8) -> u32 {
    signal as u32
}

pub fn parent_of(pid: u64) -> u64 {
    FAMILY.lock().get(&pid).map_or(0, |member| member.parent)
}

/// CPU `cpu` now runs process `pid`: what the ring-3 getppid answers there (`arch::fastcall`),
/// under the lock that orders it with an orphan's new parent.
pub fn publish_running(cpu: usize, pid: u64) {
    let family = FAMILY.lock();
    crate::arch::fastcall::process_entered(cpu, pid, family.get(&pid).map_or(0, |member| member.parent));
}

/// `getpgid`/`getsid`: the group or session of `pid` (0: the caller).
pub fn group_of(pid: u64) -> Result<(u64, u64), Errno> {
    let pid = if pid == 0 { sched::current_pid() } else { pid };
    FAMILY.lock().get(&pid).map(|member| (member.group, member.session)).ok_or(Errno::ESRCH)
}

/// `setpgid(pid, group)`: the caller or one of its children joins group `group` (0: its own
/// pid) of the caller's session, or starts it.
pub fn set_group(pid: u64, group: u64) -> Result<(), Errno> {
    let caller = sched::current_pid();
    let pid = if pid == 0 { caller } else { pid };
    let group = if group == 0 { pid } else { group };
    let mut family = FAMILY.lock();
    let session = family.get(&caller).map(|member| member.session).ok_or(Errno::ESRCH)?;
    let member = family.get(&pid).ok_or(Errno::ESRCH)?;
    if pid != caller && member.parent != caller {
        return Err(Errno::ESRCH);
    }
    if member.session != session || member.session == pid {
        return Err(Errno::EPERM);
    }
    let group_exists = family.iter().any(|(_, other)| other.group == group && other.session == session);
    if group != pid && !group_exists {
        return Err(Errno::EPERM);
    }
    family.get_mut(&pid).expect("checked").group = group;
    Ok(())
}

/// `setsid`: the caller starts a session and a group of its own (not if it leads a group: the
/// job's first process does, so it gets EPERM, as a shell's child that leads its group).
pub fn new_session() -> Result<u64, Errno> {
    let caller = sched::current_pid();
    let mut family = FAMILY.lock();
    if family.iter().any(|(_, member)| member.group == caller) {
        return Err(Errno::EPERM);
    }
    let member = family.get_mut(&caller).ok_or(Errno::ESRCH)?;
    member.group = caller;
    member.session = caller;
    Ok(caller)
}

/// The live processes of the caller's job a `kill(pid, …)` addresses: pid > 0 that process,
/// 0 the caller's group, -1 every process but the job's first, < -1 group -pid.
pub fn kill_targets(pid: i64) -> Vec<u64> {
    let caller = sched::current_pid();
    let family = FAMILY.lock();
    let alive = |member: &&Member| matches!(member.life, Life::Alive { .. });
    let (caller_group, caller_job) = family.get(&caller).map_or((0, 0), |member| (member.group, member.job));
    family
        .iter()
        .filter(|(_, member)| alive(member) && member.job == caller_job)
        .filter(|&(&candidate, member)| match pid {
            0 => member.group == caller_group,
            -1 => !member.leads,
            pid if pid < 0 => member.group == pid.unsigned_abs(),
            pid => candidate == pid as u64,
        })
        .map(|(&candidate, _)| candidate)
        .collect()
}

#[derive(Debug)]
pub enum ForkError {
    NoMemory,
    TooManyThreads,
}

/// `fork` (and `vfork`, whose child gets a copy too): a new process with a copy of the
/// caller's memory, its descriptors (sharing their open files), signal actions and mask,
/// starting at `frame` with RAX = 0 (and RSP = `stack` if not 0). The parent of a `vfork`
/// waits until the child executes a new image or ends. Returns the child's pid.
pub fn fork(
    frame: &TrapFrame,
    stack: u64,
    fs_base: u64,
    set_child_tid: Option<u64>,
    clear_child_tid: u64,
    vfork: bool,
) -> Result<u64, ForkError> {
    let parent = sched::current_pid();
    let pid = sched::reserve_tid().ok_or(ForkError::TooManyThreads)?;
    let (mut memory, shared, descriptors, executable_path) = job::with_process(|process| {
        let mut memory = process.memory.fork(frame.rsp).map_err(|_| ForkError::NoMemory)?;
        // The child maps the same blocks: MAP_SHARED memory is shared, not copied.
        match process.shared.fork_into(&mut memory.aspace) {
            Ok(shared) => Ok((memory, shared, process.descriptors.fork(), process.executable_path.clone())),
            Err(_) => {
                memory.release();
                Err(ForkError::NoMemory)
            }
        }
    })?;
    // CLONE_CHILD_SETTID writes the child's tid into the child's memory.
    if let Some(translation) = set_child_tid.and_then(|address| memory.aspace.translate(address).ok()) {
        if translation.writable && translation.bytes_left_in_leaf >= 4 {
            phys::bytes_mut(translation.physical, 4).copy_from_slice(&(pid as u32).to_le_bytes());
        }
    }
    finish_fork(parent, pid, Process { memory, descriptors, shared, executable_path }, frame, stack, fs_base, clear_child_tid, vfork)
}

#[allow(clippy::too_many_arguments)]
fn finish_fork(
    parent: u64,
    pid: u64,
    process: Process,
    frame: &TrapFrame,
    stack: u64,
    fs_base: u64,
    clear_child_tid: u64,
    vfork: bool,
) -> Result<u64, ForkError> {
    let aspace = process.memory.aspace.handle();
    // Everything the child's first system call may look at exists before it can run.
    job::add_process(pid, process);
    {
        let mut family = FAMILY.lock();
        let (group, session, job) = family.get(&parent).map_or((parent, parent, 0), |member| (member.group, member.session, member.job));
        let life = Life::Alive { ending: None };
        family.insert(pid, Member { parent, group, session, life, vfork_pending: vfork, starting: true, job, leads: false });
    }
    signal::process_created(sched::current_tid(), pid);
    let mut child = *frame;
    child.rax = 0;
    if stack != 0 {
        child.rsp = stack;
    }
    let spawned = sched::spawn_process(pid, &child, fs_base, clear_child_tid, aspace);
    if spawned.is_ok() && child_killed_while_starting(parent, pid) {
        sched::doom_process(pid, None);
    }
    if let Err(error) = spawned {
        FAMILY.lock().remove(&pid);
        signal::process_exited(pid);
        if let Some(process) = job::take_process(pid) {
            process.memory.release();
        }
        return Err(match error {
            SpawnError::TooManyThreads => ForkError::TooManyThreads,
            SpawnError::NoMemory => ForkError::NoMemory,
        });
    }
    if vfork {
        // The child runs on a copy of the memory, but the parent still waits, as callers of
        // vfork expect (the child's exec or exit comes first).
        let pending = || FAMILY.lock().get(&pid).is_some_and(|member| member.vfork_pending);
        while pending() {
            // Only the parent's own death ends this wait (Linux's is killable, not
            // interruptible): its signals wait until the child has exec'd or exited.
            if sched::wait(vfork_key(pid), u32::MAX, None, pending) == Some(WaitResult::Interrupted) {
                break;
            }
        }
    }
    Ok(pid)
}

/// Child `pid` of `parent` has its first thread: whether it is to die at once, because a kill
/// recorded its ending or its parent's while it had none (a kill of the job that came during
/// the fork; Linux's fork fails then, here the child dies instead, as the parent will).
fn child_killed_while_starting(parent: u64, pid: u64) -> bool {
    let mut family = FAMILY.lock();
    let parent_ending = match family.get(&parent).map(|member| member.life) {
        Some(Life::Alive { ending: Some(_) }) => Some(killed(SIGKILL)),
        _ => None,
    };
    let Some(member) = family.get_mut(&pid) else { return false };
    member.starting = false;
    match &mut member.life {
        Life::Alive { ending: Some(_) } => true,
        Life::Alive { ending } if parent_ending.is_some() => {
            *ending = parent_ending;
            true
        }
        _ => false,
    }
}

/// Reads a NULL-terminated array of string pointers (argv, envp) from user memory.
fn read_string_array(address: UserAddr) -> Result<Vec<String>, Errno> {
    /// Linux's limit on argv and envp together is far larger; this keeps the kernel's copy
    /// small.
    const MAX_STRINGS: usize = 4096;
    let mut strings = Vec::new();
    if address.is_null() {
        return Ok(strings);
    }
    loop {
        let [pointer] = user::read_words::<1>(address + 8 * strings.len() as u64)?;
        if pointer == 0 {
            return Ok(strings);
        }
        if strings.len() == MAX_STRINGS {
            return Err(Errno::E2BIG);
        }
        strings.push(user::read_string(UserAddr(pointer))?);
    }
}

/// `execve(path, argv, envp)`: replaces the calling process's image with the executable at
/// `path` in the job's file system (`/proc/self/exe`: the current one). On success `frame`
/// becomes the new image's entry; other threads of the process end, descriptors marked
/// close-on-exec are closed, caught signals go back to their default action, and a `vfork`
/// parent resumes. On failure nothing changed.
pub fn exec(frame: &mut TrapFrame, path: UserAddr, argv: UserAddr, envp: UserAddr) -> Result<(), Errno> {
    let path = user::read_path(path)?;
    let argv = read_string_array(argv)?;
    let env = read_string_array(envp)?;
    let named = if path == SELF_EXE { job::with_process(|process| process.executable_path.clone()) } else { path };
    // The job's own files first, then (a persistent enclave's job) the host's.
    let (resolved, file) = match fs::normalize("/", &named).and_then(|resolved| Some((fs::lookup(&resolved)?, resolved))) {
        Some((node, _)) if node.is_directory() => return Err(Errno::EACCES),
        Some((node, resolved)) => (resolved, job::LoadFile { bytes: node.contents(), physical: node.physical }),
        None => job::host_executable(&named)?,
    };
    match job::check_program(file) {
        Ok(()) => {}
        Err(job::LoadError::MissingInterpreter(_)) => return Err(Errno::ENOENT),
        Err(job::LoadError::InterpreterRefused(_, errno)) => return Err(errno),
        // A bad ELF interpreter: Linux's answer when a PT_INTERP file is not loadable.
        Err(job::LoadError::BadInterpreter(..)) => return Err(Errno::ELIBBAD),
        Err(_) => return Err(Errno::ENOEXEC),
    }
    let pid = sched::current_pid();
    // The other threads end, each at its next return to user mode (this CPU lets those
    // queued here run).
    sched::doom_process(pid, Some(sched::current_tid()));
    while sched::thread_count_of(pid) > 1 {
        sched::yield_now();
        core::hint::spin_loop();
    }
    // The old image's XPMEM segments, permits and attachments go with it, as on Linux (its
    // segments' attachers elsewhere revoked before its memory can go).
    let segments_gone = crate::xpmem::process_ended(pid);
    let old_aspace = job::with_process(|process| process.memory.aspace.handle());
    let load =
        || job::load_image_memory(job::Loader::Execve, file, &resolved, &argv, &env, Some(job::exec_heap_size()), job::exec_stack_size());
    let mut old_released = false;
    let image = match load() {
        Ok(image) => image,
        Err(job::LoadError::NoMemory(_)) => {
            // Not enough memory beside the old image (forked children are small, but several
            // may exec at once): past this point of no return the old image goes first, and
            // a failure kills the process, as Linux does.
            release_memory_for_exec(old_aspace.0, segments_gone);
            old_released = true;
            match load() {
                Ok(image) => image,
                Err(error) => {
                    log!("process {pid}: execve of {resolved} failed after its old image was released: {error:?}");
                    die_of_signal_here(SIGSEGV)
                }
            }
        }
        Err(error) => {
            crate::arch::paging::activate_root(old_aspace.1);
            return Err(match error {
                job::LoadError::StackSetup => Errno::E2BIG,
                job::LoadError::OverlapsStack => Errno::ENOMEM,
                _ => Errno::ENOEXEC,
            });
        }
    };
    sched::switch_current_aspace(image.memory.aspace.handle());
    // The new image starts with the initial vector state, as on Linux.
    crate::arch::fpu::load_initial_state();
    let (old, old_shared, closed) = job::with_process(|process| {
        process.executable_path = resolved;
        let closed = process.descriptors.close_marked();
        (core::mem::replace(&mut process.memory, image.memory), core::mem::take(&mut process.shared), closed)
    });
    // Closed outside the process table's lock: a pipe's last end wakes its waiters.
    drop(closed);
    if !old_released {
        sched::wait_until_unloaded(old_aspace.0);
    }
    release_or_keep(old, old_shared, segments_gone);
    signal::exec_reset(pid);
    end_vfork_wait(pid);
    *frame = image.entry;
    Ok(())
}

/// `execve` past its point of no return: the calling process's memory goes back now (an
/// empty stand-in takes its place until the new image is in), this CPU on the kernel's tables.
fn release_memory_for_exec(old_aspace: u64, segments_gone: bool) {
    sched::use_kernel_tables(crate::arch::tables::current_cpu());
    let Ok(stand_in) = job::memory::JobMemory::empty() else { die_of_signal_here(SIGSEGV) };
    let old = job::with_process(|process| core::mem::replace(&mut process.memory, stand_in));
    sched::wait_until_unloaded(old_aspace);
    release_or_keep(old, SharedMappings::default(), segments_gone);
}

/// Frees a process's memory once its XPMEM segments are gone everywhere (`segments_gone`,
/// from `xpmem::process_ended`); else keeps it from reuse until the job ends, when the daemon
/// has revoked every attachment of the job's segments.
fn release_or_keep(memory: job::memory::JobMemory, shared: SharedMappings, segments_gone: bool) {
    if segments_gone {
        // Large ranges cleared by the host (`enclave::zero_memory`): clearing here is emulated
        // on PVM, about 40 ms a MiB, and a rank ending beside other jobs may leave hundreds.
        memory.release_with(crate::enclave::zero_memory);
        // A block goes once no other process maps it (not under a lock: the host may clear it).
        drop(shared);
    } else {
        job::keep_until_job_ends(memory, shared);
    }
}

fn end_vfork_wait(pid: u64) {
    let was_pending = FAMILY.lock().get_mut(&pid).is_some_and(|member| core::mem::replace(&mut member.vfork_pending, false));
    if was_pending {
        sched::wake_kernel_key(vfork_key(pid));
    }
}

/// Records how process `pid` ends (the first call counts).
fn record_ending(pid: u64, status: u32) {
    if let Some(Member { life: Life::Alive { ending: ending @ None }, .. }) = FAMILY.lock().get_mut(&pid) {
        *ending = Some(status);
    }
}

/// `exit_group`: the calling process ends with `code`.
pub fn exit_group(code: u8) -> ! {
    if leads_job(sched::current_pid()) {
        leader_ending(sched::current_pid(), exited(code));
    }
    end_other_process_here(exited(code), code)
}

/// The calling process dies of `signal` (a fault, or a signal whose default action
/// terminates).
pub fn die_of_signal_here(signal: u8) -> ! {
    if leads_job(sched::current_pid()) {
        if !crate::enclave::other_jobs_run(sched::current_job()) {
            job::exit_by_signal(signal)
        }
        leader_ending(sched::current_pid(), killed(signal));
    }
    end_other_process_here(killed(signal), 0)
}

/// The calling process (not a job's first alone in the enclave, whose end ends everything)
/// ends with wait `status`: its other threads are doomed, and this one exits with
/// `thread_code`.
fn end_other_process_here(status: u32, thread_code: u8) -> ! {
    let pid = sched::current_pid();
    record_ending(pid, status);
    sched::doom_process(pid, Some(sched::current_tid()));
    sched::exit_current(thread_code)
}

/// Process `pid` (not the caller's) dies of `signal`: its threads end (the last one ends the
/// process); if it has none left, it ends here.
pub fn kill(pid: u64, signal: u8) {
    if pid == sched::current_pid() {
        die_of_signal_here(signal)
    }
    if leads_job(pid) {
        if !crate::enclave::other_jobs_run(sched::current_job()) {
            job::exit_by_signal(signal)
        }
        leader_ending(pid, killed(signal));
    }
    record_ending(pid, killed(signal));
    end_threads(pid);
}

/// The last thread of process `pid` is leaving (on this CPU, in `sched::exit_current`): the
/// job ends with its first process; any other process ends here.
pub fn last_thread_exited(pid: u64, code: u8) {
    if leads_job(pid) {
        let status = match FAMILY.lock().get(&pid).map(|member| member.life) {
            Some(Life::Alive { ending: Some(status) }) => status,
            _ => exited(code),
        };
        if !crate::enclave::other_jobs_run(sched::current_job()) {
            match status & 0x7f {
                0 => job::exit((status >> 8) & 0xff),
                signal => job::exit_by_signal(signal as u8),
            }
        }
        leader_ending(pid, status);
    }
    sched::use_kernel_tables(crate::arch::tables::current_cpu());
    end_process(pid, code);
}

/// Process `pid` has no threads left: its memory and descriptors go, it becomes a zombie for
/// its parent (which gets SIGCHLD), its children go to its job's first process. The last
/// process of a job whose leader has ended ends the job (`crate::enclave::job_finished`).
fn end_process(pid: u64, code: u8) {
    // Its XPMEM segments go (their attachers in other processes, other enclaves and host
    // processes get SIGBUS) before its memory does: an attacher elsewhere must never see its
    // frames reused.
    let segments_gone = crate::xpmem::process_ended(pid);
    let Some(process) = job::take_process(pid) else { return };
    sched::wait_until_unloaded(process.memory.aspace.handle().0);
    release_or_keep(process.memory, process.shared, segments_gone);
    drop(process.descriptors);
    signal::process_exited(pid);
    let (parent, leader, orphaned_zombies, job_over) = {
        let mut family = FAMILY.lock();
        let Some(member) = family.get_mut(&pid) else { return };
        let status = match member.life {
            Life::Alive { ending: Some(status) } => status,
            _ => exited(code),
        };
        member.life = Life::Zombie(status);
        let (parent, job) = (member.parent, member.job);
        if parent == 0 {
            // Nobody waits for it (a leader, or an orphan of an ended leader).
            family.remove(&pid);
        }
        let leader = family.iter().find(|(_, other)| other.job == job && other.leads).map_or(0, |(&leader, _)| leader);
        let mut orphaned_zombies = false;
        for (&child_pid, child) in family.iter_mut().filter(|(_, child)| child.parent == pid) {
            child.parent = leader;
            crate::arch::fastcall::parent_changed(child_pid, leader);
            orphaned_zombies |= matches!(child.life, Life::Zombie(_));
        }
        if leader == 0 {
            family.retain(|_, member| member.parent != 0 || matches!(member.life, Life::Alive { .. }));
        }
        let job_over = (leader == 0 && live_members(&family, job).next().is_none()).then_some(job);
        (parent, leader, orphaned_zombies, job_over)
    };
    end_vfork_wait(pid);
    if orphaned_zombies && leader != 0 {
        sched::wake_kernel_key(children_key(leader));
    }
    if parent != 0 {
        signal::send_to_process(parent, SIGCHLD);
        sched::wake_kernel_key(children_key(parent));
    }
    if crate::job::is_verbose() {
        log!("process {pid} ended");
    }
    if let Some(job) = job_over {
        crate::enclave::job_finished(job);
    }
}

/// Which children a `wait` looks at.
#[derive(Clone, Copy)]
pub enum Selector {
    Any,
    Pid(u64),
    Group(u64),
}

/// What a wait found: a child that ended (pid, wait status), or none yet.
pub enum Waited {
    Ended(u64, u32),
    NotYet,
}

/// `wait4`/`waitid`: the first ended child `selector` names (reaped unless `keep`), waiting
/// for one unless `no_hang`. ECHILD when the caller has no such child.
pub fn wait_for_child(selector: Selector, no_hang: bool, keep: bool) -> Result<Waited, Errno> {
    let caller = sched::current_pid();
    let caller_group = group_of(0)?.0;
    let matches = move |pid: u64, member: &Member| {
        member.parent == caller
            && match selector {
                Selector::Any => true,
                Selector::Pid(wanted) => pid == wanted,
                Selector::Group(0) => member.group == caller_group,
                Selector::Group(group) => member.group == group,
            }
    };
    // Some(ended child) / None: children, none ended / Err: no such child.
    let look = move || -> Result<Option<(u64, u32)>, Errno> {
        let family = FAMILY.lock();
        let mut candidates = family.iter().filter(|&(&pid, member)| matches(pid, member)).peekable();
        if candidates.peek().is_none() {
            return Err(Errno::ECHILD);
        }
        Ok(candidates.find_map(|(&pid, member)| match member.life {
            Life::Zombie(status) => Some((pid, status)),
            Life::Alive { .. } => None,
        }))
    };
    let mut interrupted = false;
    loop {
        if let Some((pid, status)) = look()? {
            if !keep {
                FAMILY.lock().remove(&pid);
            }
            return Ok(Waited::Ended(pid, status));
        }
        if no_hang {
            return Ok(Waited::NotYet);
        }
        // A signal ends the wait as on Linux (EINTR, or restarted under SA_RESTART), once a
        // last look has found no child ended (a child's SIGCHLD may come first).
        if interrupted {
            return Err(Restart::Always.errno());
        }
        interrupted = matches!(
            sched::wait(children_key(caller), u32::MAX, None, || matches!(look(), Ok(None))),
            Some(WaitResult::Interrupted | WaitResult::Signal)
        );
    }
}
