//! The kernel side of the file-call slots (`enclave_proto::slots`): a forwarded file call is
//! written, encoded, into this CPU's slot page, which a host thread polls, and the calling
//! thread spins until the answer is written back. No framing, no copy through the ring, no
//! interrupt: on PVM each of those is emulated kernel work, and the channel's round trip cost
//! about 1.8 ms a call. The channel still serves while the host has not said it polls
//! (`HOST_READY`), and carries any request too long for a slot.
//!
//! A waiting thread keeps its CPU (as for the channel: it does not yield), so the CPU's slot is
//! its own; CPU 0 still serves the channel while it waits (pings, a kill), and a job ended
//! meanwhile leaves its request posted: the next call on that CPU waits for its answer first.

use super::FileAnswer;
use crate::arch::{channel as machine_channel, phys, tables};
use crate::linux::Errno;
use crate::mm::pmem;
use core::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use enclave_proto::slots::{self, ANSWERED, DATA, DATA_CAPACITY, FREE, GUEST_SLEEPING, HOST_POLLING, HOST_READY, LENGTH, POSTED, STATE};
use enclave_proto::{EnclaveMessage, FileOp, HostMessage};

/// The control page's physical address (0: no slots), the slot count and the doorbell port.
static BASE: AtomicU64 = AtomicU64::new(0);
static COUNT: AtomicU16 = AtomicU16::new(0);
static DOORBELL_PORT: AtomicU16 = AtomicU16::new(0);

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

/// Sends `FileRequest { job, request, op }` through this CPU's slot and waits for the answer;
/// `None` when the slots cannot carry it (none, the host not polling them yet, too long).
pub fn call(job: u32, request: u32, op: &FileOp<'_>) -> Option<FileAnswer> {
    let base = BASE.load(Ordering::Acquire);
    let cpu = tables::current_cpu();
    if base == 0 || cpu >= COUNT.load(Ordering::Relaxed) as usize || word(base + HOST_READY).load(Ordering::SeqCst) == 0 {
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
    // While the host polls, so does this CPU; else CPU 0 halts until the channel interrupt
    // (a spinning vCPU waits longest for a busy host's cores). Other CPUs get no channel
    // interrupt: they poll.
    let sleeping = word(slot + GUEST_SLEEPING);
    while state.load(Ordering::SeqCst) != ANSWERED {
        if cpu == 0 && word(base + HOST_POLLING).load(Ordering::SeqCst) == 0 {
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
    Some(answer)
}
