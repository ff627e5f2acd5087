//! File-call request slots: a faster way for `FileRequest`s than the channel.
//!
//! A forwarded call on the channel pays for framing, copies, a doorbell, the host's wake-up, an
//! interrupt into the enclave and its decoding, all of it emulated kernel work on PVM (about
//! 1.8 ms a call). Instead the kernel writes the encoded `FileRequest` into its CPU's slot, a
//! page of enclave RAM that a host thread polls, and spins until the encoded answer
//! (`FileResult` or `FileAttributes`) is written back in its place. The channel still carries
//! everything else, and any request that does not fit a slot.
//!
//! Layout (`FileSlots { gpa, count }`): at `gpa` the control page, then `count` slot pages;
//! the words are little-endian u64s, 8-byte aligned.
//!
//! | where | what | written by |
//! |---|---|---|
//! | control + [`HOST_READY`] | u64: 1 while a host thread serves the slots; the kernel uses the channel while it is 0 | host |
//! | control + [`HOST_POLLING`] | u64: 1 while the host polls the slots, 0 while it sleeps | host |
//! | slot + [`STATE`] | u64: [`FREE`], [`POSTED`] or [`ANSWERED`] | both |
//! | slot + [`LENGTH`] | u64: the request's length, then the answer's | both |
//! | slot + [`GUEST_SLEEPING`] | u64: 1 while the kernel waits for this slot's answer halted | kernel |
//! | slot + [`DATA`] | the encoded message, at most [`DATA_CAPACITY`] bytes | both |
//!
//! The kernel posts by writing the message and its length, then `STATE = POSTED`; then, if
//! `HOST_POLLING` is 0, it writes the channel's doorbell port to wake the host. The host, on
//! `POSTED`, reads the request, serves it, writes the answer and its length, then `STATE =
//! ANSWERED`, and raises the channel interrupt if `GUEST_SLEEPING` is 1; the kernel reads the
//! answer and sets `FREE`. A waiting kernel halts (sets `GUEST_SLEEPING`, looks at `STATE`
//! once more, halts) rather than spin while the host does not poll: a spinning vCPU is the
//! host scheduler's last choice on a busy machine. Both sides use sequentially consistent
//! accesses for these words, so a host that goes to sleep looks at every slot once more after
//! clearing `HOST_POLLING`, and neither a post nor an answer is missed. Nothing in the slots is
//! trusted by the host: a request is decoded and checked as one from the channel.

/// One control page and one page per slot.
pub const PAGE_SIZE: u64 = 4096;
/// Offset of the host's polling flag in the control page.
pub const HOST_POLLING: u64 = 0;
/// Offset of the host's serving flag in the control page.
pub const HOST_READY: u64 = 8;
/// Offsets in a slot page.
pub const STATE: u64 = 0;
pub const LENGTH: u64 = 8;
pub const GUEST_SLEEPING: u64 = 16;
pub const DATA: u64 = 64;
pub const DATA_CAPACITY: usize = (PAGE_SIZE - DATA) as usize;
/// Slot states.
pub const FREE: u64 = 0;
pub const POSTED: u64 = 1;
pub const ANSWERED: u64 = 2;
/// Most slots a kernel may publish (one per vCPU).
pub const MAX_SLOTS: u16 = 64;

/// Guest-physical address of slot `index` of the slots at `gpa`.
pub const fn slot_address(gpa: u64, index: u16) -> u64 {
    gpa + (1 + index as u64) * PAGE_SIZE
}

/// The bytes the slots at `gpa` span, control page included, or `None` when `count` is 0 or
/// above [`MAX_SLOTS`] or `gpa` is not page aligned.
pub const fn span(gpa: u64, count: u16) -> Option<u64> {
    if count == 0 || count > MAX_SLOTS || gpa & (PAGE_SIZE - 1) != 0 {
        return None;
    }
    Some((1 + count as u64) * PAGE_SIZE)
}

/// Ring-3 file calls (the LWK's fast-call page serves them without entering its kernel).
///
/// The job's code writes the call into its CPU's slot of its process's request page (user
/// memory at [`RING3_REQUEST_PAGE`], [`RING3_SLOT_SIZE`] bytes per CPU) and spins on the
/// slot's state. What the host needs beyond the call, and must not take from the job, the
/// kernel writes into the control page, per CPU from [`RING3_CONTEXT`]: the page-table root of
/// the process running there (0: none, or ring-3 calls off), the guest-physical address of
/// that process's descriptor table (kernel memory: a lock word, a changed word, then
/// [`RING3_FDS`] u64 entries, see [`RING3_FD_ENTRIES`]) and the job. The host finds the request page and every buffer through that
/// root (user pages of the enclave's RAM only), and moves data straight into or out of them.
///
/// A slot: the state word ([`FREE`], [`POSTED`], [`RING3_TAKEN`] while the host serves it,
/// [`ANSWERED`]), the call (Linux's number and its first four arguments, with the path copied
/// in for the path calls, NUL-terminated) and the result (Linux's return value: a count, an
/// offset, 0, or a negated errno; [`RING3_ESCALATE`] when the kernel must serve the call
/// itself). The job posts with `FREE`/`ANSWERED` -> `POSTED`; the host takes a call with
/// `POSTED` -> `TAKEN` (compare-and-swap), so a job that gives up waiting can take it back
/// with `POSTED` -> `FREE` and nothing is done twice.
pub const RING3_CONTEXT: u64 = 64;
pub const RING3_CONTEXT_SIZE: u64 = 32;
/// In the control page: the guest-physical address and length of the paths of the job's own
/// in-memory files (NUL-separated, absolute, normalized; the kernel's, not the host's: a path
/// call naming one of them goes to the kernel), kernel-written.
pub const RING3_JOB_FILES: u64 = 16;
pub const RING3_JOB_FILES_LEN: u64 = 24;
/// Offsets in a CPU's context in the control page.
pub const RING3_ROOT: u64 = 0;
pub const RING3_FD_TABLE: u64 = 8;
pub const RING3_JOB: u64 = 16;
pub const RING3_REQUEST: u64 = 24;
/// Descriptors the table covers (higher ones take the kernel path).
pub const RING3_FDS: u64 = 256;
/// The descriptor table's words. The lock word is 0 when free; the kernel takes it with 1,
/// the host with 2 (compare-and-swap, held for a few host system calls at most), and whoever
/// holds it may change entries. The host sets the changed word to 1 when it opened or closed
/// a descriptor, so the kernel takes those changes into its own table before it next uses it.
pub const RING3_FD_LOCK: u64 = 0;
pub const RING3_FD_CHANGED: u64 = 8;
/// The entries, one u64 per descriptor number: 0 free; [`RING3_FD_KERNEL`] in use by something
/// the host does not serve (console, pipe, in-memory file, above all a number the host must not
/// hand out); else a host file: its handle + 1 in the low 32 bits, [`RING3_FD_SOLE`] when no
/// other descriptor or process shares its open file (the host may close it), [`RING3_FD_CLOEXEC`]
/// and its status flags (F_GETFL) from bit [`RING3_FD_STATUS_SHIFT`]. The host hands out the
/// lowest free number below [`RING3_FDS`], as Linux would; with none free the kernel decides.
pub const RING3_FD_ENTRIES: u64 = 16;
pub const RING3_FD_TABLE_SIZE: u64 = RING3_FD_ENTRIES + RING3_FDS * 8;
pub const RING3_FD_KERNEL: u64 = 1 << 63;
pub const RING3_FD_SOLE: u64 = 1 << 32;
pub const RING3_FD_CLOEXEC: u64 = 1 << 33;
pub const RING3_FD_STATUS_SHIFT: u32 = 40;
pub const RING3_FD_STATUS_MASK: u64 = 0x7f_ffff;
/// Where each process's request page lies in its address space.
pub const RING3_REQUEST_PAGE: u64 = 0x0000_7fff_ffff_c000;
pub const RING3_SLOT_SIZE: u64 = 256;
/// Offsets in a request slot.
pub const RING3_STATE: u64 = 0;
pub const RING3_CALL: u64 = 8;
pub const RING3_ARGS: u64 = 16;
pub const RING3_RESULT: u64 = 48;
/// The host's word in a slot: 1 while its pump polls for ring-3 calls (it takes a posted call
/// within a nap), 0 once it sleeps on the doorbell; the job's code waits long for the host
/// only while it is 1. The job may write it too, and then only delays its own calls.
pub const RING3_HOST_AWAKE: u64 = 56;
pub const RING3_PATH: u64 = 64;
pub const RING3_PATH_CAPACITY: u64 = RING3_SLOT_SIZE - RING3_PATH;
/// The host has taken the call.
pub const RING3_TAKEN: u64 = 3;
/// The result that sends the call to the kernel path (a descriptor that is not a host file, a
/// buffer not mapped yet, a path that is the enclave's own).
pub const RING3_ESCALATE: i64 = i64::MIN;

const _: () = assert!(RING3_CONTEXT + MAX_SLOTS as u64 * RING3_CONTEXT_SIZE <= PAGE_SIZE);
