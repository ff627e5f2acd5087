//! The kernel side of the file-call slots (`enclave_proto::slots`): a forwarded file call is
//! written, encoded, into this CPU's slot page, which a host thread polls, and the calling
//! thread spins until the answer is written back. No framing, no copy through the ring, no
//! interrupt: on PVM each of those is emulated kernel work, and the channel's round trip cost
//! about 1.8 ms a call. The channel still serves while the host has not said it polls
//! (`HOST_READY`), and carries any request too long for a slot.
//!
//! A waiting thread keeps its CPU while no other thread waits for it (the host answers within
//! microseconds when idle); CPU 0 still serves the channel while it waits (pings, a kill), and
//! a job ended meanwhile leaves its request posted: the next call on that CPU waits for its
//! answer first. When others wait for the CPU, the waiter yields it to them until its answer
//! is there, holding its slot meanwhile (`HELD`: other threads take the channel, or the
//! kernel path for ring-3 calls, so nothing else is posted there). Before, a file call kept
//! its CPU through the host's whole service (a 32 MiB read: a good 50 ms; seconds on a loaded
//! host) from the threads queued for it, MPI ranks' progress threads among them.

use super::FileAnswer;
use crate::arch::tables::MAX_CPUS;
use crate::arch::{channel as machine_channel, phys, tables};
use crate::linux::Errno;
use crate::mm::pmem;
use core::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use enclave_proto::slots::{
    self, ANSWERED, DATA, DATA_CAPACITY, FREE, GUEST_SLEEPING, HOST_POLLING, HOST_READY, LENGTH, POSTED, RING3_CALL, RING3_CONTEXT,
    RING3_CONTEXT_SIZE, RING3_ESCALATE, RING3_FD_TABLE, RING3_JOB, RING3_JOB_FILES, RING3_JOB_FILES_LEN, RING3_REQUEST, RING3_REQUEST_PAGE,
    RING3_RESULT, RING3_ROOT, RING3_SLOT_SIZE, RING3_STATE, RING3_TAKEN, STATE,
};
use enclave_proto::{EnclaveMessage, FileOp, HostMessage};

/// How long a kernel-path call spins for its answer before CPU 0 halts (µs).
const SPIN_BEFORE_HALT_US: u64 = 2000;

/// The control page's physical address (0: no slots), the slot count and the doorbell port.
static BASE: AtomicU64 = AtomicU64::new(0);
static COUNT: AtomicU16 = AtomicU16::new(0);
static DOORBELL_PORT: AtomicU16 = AtomicU16::new(0);

/// Per CPU: the thread (tid + 1; 0: none) that gave the CPU up while the host served its call
/// in the CPU's kernel slot (`KERNEL`) or ring-3 slot (`RING3`), and still waits for the answer
/// there; and that ring-3 slot's physical address.
struct Held {
    kernel: AtomicU64,
    ring3: AtomicU64,
    ring3_slot: AtomicU64,
}

static HELD: [Held; MAX_CPUS] =
    [const { Held { kernel: AtomicU64::new(0), ring3: AtomicU64::new(0), ring3_slot: AtomicU64::new(0) } }; MAX_CPUS];

/// Whether `holder` names a thread that still waits for its answer (a killed one never comes
/// back for it: its hold ends here).
fn still_held(holder: &AtomicU64) -> bool {
    match holder.load(Ordering::SeqCst) {
        0 => false,
        tid_plus_one if crate::sched::thread_cpu_time(tid_plus_one - 1).is_some() => true,
        _ => {
            holder.store(0, Ordering::SeqCst);
            false
        }
    }
}

/// The word at physical `address` of the slot pages (allocated for good), which the host
/// writes concurrently.
fn word(address: u64) -> &'static AtomicU64 {
    phys::atomic_u64(address)
}

/// Allocates one slot per vCPU and the control page; the message to tell the host, or `None`
/// when there is no memory for them (file calls then stay on the channel).
pub fn publish(vcpus: u16, doorbell_port: u16) -> Option<EnclaveMessage<'static>> {
    let count = vcpus.clamp(1, slots::MAX_SLOTS.min(tables::MAX_CPUS as u16));
    let span = slots::span(0, count)?;
    let base = pmem::allocate(span, slots::PAGE_SIZE)?;
    // Only the words the host reads before the kernel writes them need clearing (clearing
    // whole pages is slow emulated work on PVM).
    for address in [base + HOST_POLLING, base + HOST_READY] {
        word(address).store(0, Ordering::SeqCst);
    }
    for index in 0..count {
        word(slots::slot_address(base, index) + STATE).store(FREE, Ordering::SeqCst);
        word(slots::slot_address(base, index) + GUEST_SLEEPING).store(0, Ordering::SeqCst);
    }
    DOORBELL_PORT.store(doorbell_port, Ordering::Relaxed);
    COUNT.store(count, Ordering::Relaxed);
    BASE.store(base, Ordering::Release);
    Some(EnclaveMessage::FileSlots { gpa: base, count })
}

/// Sends `FileRequest { job, request, op }` through this CPU's slot and waits for the answer,
/// yielding the CPU while others wait for it if `may_yield` (see the module comment); `None`
/// when the slots cannot carry it (none, the host not polling them yet, too long, the slot
/// held by a thread that yielded).
pub fn call(job: u32, request: u32, op: &FileOp<'_>, may_yield: bool) -> Option<FileAnswer> {
    let base = BASE.load(Ordering::Acquire);
    let cpu = tables::current_cpu();
    if base == 0 || cpu >= COUNT.load(Ordering::Relaxed) as usize || word(base + HOST_READY).load(Ordering::SeqCst) == 0 {
        return None;
    }
    if still_held(&HELD[cpu].kernel) {
        return None;
    }
    let slot = slots::slot_address(base, cpu as u16);
    let state = word(slot + STATE);
    // A request of a job that ended while it waited may still be being served.
    while state.load(Ordering::SeqCst) == POSTED {
        super::poll_host_once();
    }
    let message = EnclaveMessage::FileRequest { job, request, op: *op };
    let length = message.encode(phys::bytes_mut(slot + DATA, DATA_CAPACITY)).ok()?;
    word(slot + LENGTH).store(length as u64, Ordering::Relaxed);
    state.store(POSTED, Ordering::SeqCst);
    if word(base + HOST_POLLING).load(Ordering::SeqCst) == 0 {
        machine_channel::ring_doorbell(DOORBELL_PORT.load(Ordering::Relaxed));
    }
    // While the host polls, so does this CPU, and for `SPIN_BEFORE_HALT` after posting (the
    // host's pump wakes on the doorbell and answers within that on an idle host; a halted
    // vCPU's own wake-up takes milliseconds on a loaded one); then CPU 0 halts until the
    // channel interrupt (a spinning vCPU waits longest for a busy host's cores). Other CPUs
    // get no channel interrupt: they poll.
    let sleeping = word(slot + GUEST_SLEEPING);
    let halt_after = crate::arch::cpu::read_tsc() + crate::clock::tsc_hz() / 1_000_000 * SPIN_BEFORE_HALT_US;
    let mut held = false;
    while state.load(Ordering::SeqCst) != ANSWERED {
        if may_yield && crate::sched::others_wait_here() {
            if !held {
                HELD[cpu].kernel.store(crate::sched::current_tid() + 1, Ordering::SeqCst);
                held = true;
            }
            // Maybe back on another CPU: only CPU 0 halts below.
            crate::sched::yield_now();
        } else if tables::current_cpu() == 0
            && word(base + HOST_POLLING).load(Ordering::SeqCst) == 0
            && crate::arch::cpu::read_tsc() > halt_after
        {
            sleeping.store(1, Ordering::SeqCst);
            if state.load(Ordering::SeqCst) != ANSWERED {
                super::wait_for_host_message();
            }
            sleeping.store(0, Ordering::SeqCst);
        } else {
            super::poll_host_once();
        }
    }
    let length = (word(slot + LENGTH).load(Ordering::Relaxed) as usize).min(DATA_CAPACITY);
    let answer = match HostMessage::decode(phys::bytes(slot + DATA, length)) {
        Ok(HostMessage::FileResult { request: answered, result, .. }) if answered == request => FileAnswer::Result(result),
        Ok(HostMessage::FileAttributes { request: answered, attributes, .. }) if answered == request => FileAnswer::Attributes(attributes),
        // An empty or foreign answer: the host could not serve it.
        _ => FileAnswer::Result(-(Errno::EIO.0 as i64)),
    };
    state.store(FREE, Ordering::SeqCst);
    if held {
        HELD[cpu].kernel.store(0, Ordering::SeqCst);
    }
    Some(answer)
}

/// The words of `cpu`'s ring-3 context in the control page (`enclave_proto::slots`), if the
/// host serves the slots.
fn ring3_context(cpu: usize) -> Option<u64> {
    let base = BASE.load(Ordering::Acquire);
    (base != 0 && cpu < COUNT.load(Ordering::Relaxed) as usize).then(|| base + RING3_CONTEXT + cpu as u64 * RING3_CONTEXT_SIZE)
}

/// The physical address of kernel memory at `virtual_address` (the heap lives in the
/// physical-memory window or the image).
fn physical_of(virtual_address: u64) -> u64 {
    if virtual_address >= phys::KERNEL_VMA {
        virtual_address - phys::KERNEL_VMA
    } else {
        virtual_address - phys::PHYSMAP_BASE
    }
}

/// Lets the running process's ring-3 file calls reach the host from this CPU (the kernel path
/// calls this before forwarding a call, and after a host file is opened): tells the host the
/// process's page-table root, descriptor table, job and request page, then tells the ring-3
/// code it may post (`arch::fastcall`). Nothing when the host does not serve the slots.
pub fn ring3_publish(job: u32) {
    let cpu = tables::current_cpu();
    let Some(context) = ring3_context(cpu) else { return };
    if word(base_ready()).load(Ordering::SeqCst) == 0 || still_held(&HELD[cpu].ring3) {
        return;
    }
    let found = crate::job::with_process(|process| {
        let request = process.memory.aspace.translate(RING3_REQUEST_PAGE).ok()?.physical;
        Some((request, physical_of(process.descriptors.host_handle_table())))
    });
    let Some((request, fd_table)) = found else { return };
    // No call of this CPU is in flight (this thread is in the kernel): its slot starts free.
    word(request + cpu as u64 * RING3_SLOT_SIZE + RING3_STATE).store(FREE, Ordering::SeqCst);
    word(context + RING3_FD_TABLE).store(fd_table, Ordering::SeqCst);
    word(context + RING3_JOB).store(job as u64, Ordering::SeqCst);
    word(context + RING3_REQUEST).store(request, Ordering::SeqCst);
    word(context + RING3_ROOT).store(crate::arch::cpu::read_cr3() & !0xfff, Ordering::SeqCst);
    crate::arch::fastcall::files_ready(cpu, true);
}

fn base_ready() -> u64 {
    BASE.load(Ordering::Acquire) + HOST_READY
}

/// This CPU loads another address space: the host must not serve ring-3 calls through the
/// old one, and the ring-3 code posts none until the kernel publishes the new one.
pub fn ring3_forget() {
    let cpu = tables::current_cpu();
    crate::arch::fastcall::files_ready(cpu, false);
    if let Some(context) = ring3_context(cpu) {
        word(context + RING3_ROOT).store(0, Ordering::SeqCst);
    }
}

/// The ring-3 call this CPU posted, when its code was interrupted after posting it: takes it
/// back if the host has not taken it (`None`: the call is made again, or on the kernel path),
/// else waits for its answer and returns the result, which the caller then gets as the
/// kernel path would give it. `None` too when the host sent it to the kernel.
pub fn ring3_finish() -> Option<i64> {
    let cpu = tables::current_cpu();
    let request = word(ring3_context(cpu)? + RING3_REQUEST).load(Ordering::SeqCst);
    if request == 0 {
        return None;
    }
    let slot = request + cpu as u64 * RING3_SLOT_SIZE;
    let state = word(slot + RING3_STATE);
    loop {
        match state.load(Ordering::SeqCst) {
            POSTED if state.compare_exchange(POSTED, FREE, Ordering::SeqCst, Ordering::SeqCst).is_ok() => return None,
            ANSWERED => break,
            FREE => return None,
            // Taken: the host answers. (Only the job could write anything else there, and
            // then breaks only its own calls; CPU 0 still serves the channel, a kill included.)
            _ => super::poll_host_once(),
        }
    }
    state.store(FREE, Ordering::SeqCst);
    Some(word(slot + RING3_RESULT).load(Ordering::SeqCst) as i64).filter(|&result| result != RING3_ESCALATE)
}

/// The ring-3 call this CPU posted is in the host's hands (taken) and other threads wait for
/// the CPU: the calling thread is to give the CPU up and collect the answer later
/// (`ring3_collect`), so this CPU's ring-3 slot is held for it meanwhile (no ring-3 file calls
/// here until the kernel path publishes the CPU again). Whether it is held so.
pub fn ring3_hold() -> bool {
    let cpu = tables::current_cpu();
    let Some(context) = ring3_context(cpu) else { return false };
    let request = word(context + RING3_REQUEST).load(Ordering::SeqCst);
    if request == 0 || !crate::sched::others_wait_here() {
        return false;
    }
    let slot = request + cpu as u64 * RING3_SLOT_SIZE;
    if word(slot + RING3_STATE).load(Ordering::SeqCst) != RING3_TAKEN {
        return false;
    }
    crate::arch::fastcall::files_ready(cpu, false);
    HELD[cpu].ring3_slot.store(slot, Ordering::SeqCst);
    HELD[cpu].ring3.store(crate::sched::current_tid() + 1, Ordering::SeqCst);
    true
}

/// What a thread coming back for its held ring-3 call (`ring3_hold`) gets.
pub enum Collected {
    /// The call's result.
    Result(i64),
    /// The call (Linux's number) is the kernel path's to make: the host sent it there.
    Kernel(u64),
    /// The calling thread holds no call of CPU `cpu` (a job's own jump to the collecting code).
    NotHeld,
}

/// Waits for the answer of the ring-3 call the calling thread holds on CPU `cpu`, yielding
/// its CPU while others wait for it, and releases the slot.
pub fn ring3_collect(cpu: u64) -> Collected {
    let Some(held) = HELD.get(cpu as usize) else { return Collected::NotHeld };
    if held.ring3.load(Ordering::SeqCst) != crate::sched::current_tid() + 1 {
        return Collected::NotHeld;
    }
    let slot = held.ring3_slot.load(Ordering::SeqCst);
    let state = word(slot + RING3_STATE);
    while state.load(Ordering::SeqCst) == RING3_TAKEN && !crate::sched::current_thread_doomed() {
        if crate::sched::others_wait_here() {
            crate::sched::yield_now();
        } else {
            super::poll_host_once();
        }
    }
    let collected = match state.load(Ordering::SeqCst) {
        ANSWERED => match word(slot + RING3_RESULT).load(Ordering::SeqCst) as i64 {
            RING3_ESCALATE => Collected::Kernel(word(slot + RING3_CALL).load(Ordering::SeqCst)),
            result => Collected::Result(result),
        },
        // Taken still (the thread is being killed), or the job wrote its own slot.
        RING3_TAKEN => Collected::Result(-(Errno::EIO.0 as i64)),
        _ => Collected::Kernel(word(slot + RING3_CALL).load(Ordering::SeqCst)),
    };
    if state.load(Ordering::SeqCst) == ANSWERED {
        state.store(FREE, Ordering::SeqCst);
    }
    held.ring3.store(0, Ordering::SeqCst);
    collected
}

/// The page listing the job's own in-memory paths for the host (0 until first needed).
static JOB_FILES_PAGE: AtomicU64 = AtomicU64::new(0);

/// Tells the host which paths are the job's own files (`fs`: absolute, normalized), so that
/// ring-3 path calls naming them go to the kernel. False when the host cannot be told (no
/// slots, no memory, too many names for a page): ring-3 path calls must then all go there.
pub fn publish_job_files<'a>(paths: impl Iterator<Item = &'a str>) -> bool {
    let base = BASE.load(Ordering::Acquire);
    if base == 0 {
        return false;
    }
    if JOB_FILES_PAGE.load(Ordering::Relaxed) == 0 {
        let Some(page) = pmem::allocate_pages(1) else { return false };
        JOB_FILES_PAGE.store(page, Ordering::Relaxed);
    }
    let page = JOB_FILES_PAGE.load(Ordering::Relaxed);
    // Withdrawn while it changes: the host reads an empty list as "every path is the host's",
    // which is wrong only for calls the job makes before it starts.
    word(base + RING3_JOB_FILES_LEN).store(0, Ordering::SeqCst);
    let list = phys::bytes_mut(page, slots::PAGE_SIZE as usize);
    let mut length = 0;
    for path in paths {
        let end = length + path.len() + 1;
        if end > list.len() {
            return false;
        }
        list[length..end - 1].copy_from_slice(path.as_bytes());
        list[end - 1] = 0;
        length = end;
    }
    word(base + RING3_JOB_FILES).store(page, Ordering::SeqCst);
    word(base + RING3_JOB_FILES_LEN).store(length as u64, Ordering::SeqCst);
    true
}
