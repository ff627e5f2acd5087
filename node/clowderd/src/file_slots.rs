//! The host side of the kernel's file-call slots (`enclave_proto::slots`): the enclave's pump
//! thread serves each posted `FileRequest` exactly as one from the channel
//! (`Enclave::serve_file_request`: the job's user, its scope, Linux errnos)
//! and writes the answer back in its place.
//!
//! Served by the pump itself, not a thread of its own: on a loaded host a busy poller is
//! scheduled last, while a thread woken from sleep is run at once. The kernel rings the
//! channel's doorbell after posting unless the control page says the host polls, which the
//! pump does for [`WATCH`] after each request it served (a job's calls come in bursts)
//! before it goes back to sleeping on the doorbell: no core is burnt between bursts. A kernel
//! that waits halted is woken by the channel interrupt once its answer is written. The same
//! polling serves the job's ring-3 calls (`crate::ring3_files`), which cannot ring: while the
//! pump polls it says so in each CPU's ring-3 slot, and the job's code then waits for it
//! several naps long; a call the pump does not take in that time, or made while it sleeps,
//! goes to the kernel path, which rings, and the pump then polls for the calls that follow.
//! Polling is spinning for [`SPIN`], then naps, short ones ([`POLL_NAP`]) until
//! [`POLL_WINDOW`], then [`WATCH_NAP`] ones: a few thousand wake-ups a second for one second
//! after the last call, not a core. The pump reads the channel meanwhile: polling stops when
//! the channel has a message or the doorbell rang, and goes on after the pump has handled it
//! (a call on the channel after one in a slot, the kernel's way for one too long for a slot,
//! waited for the whole second before: 1.1 s for an LWK job's first).
//!
//! `CLOWDER_FILE_SLOTS=off` in the daemon's environment leaves the slots unserved, so every
//! call takes the channel (to compare the two).
//!
//! Nothing the guest writes is trusted: the slots' place is checked against the enclave's RAM
//! once, a request is copied out before it is decoded (the guest cannot change it while it is
//! served), its length is bounded, and what is not a well-formed `FileRequest` gets an empty
//! answer (the kernel reads that as EIO).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ring3_files;

use enclave_proto::slots::{self, ANSWERED, DATA, DATA_CAPACITY, GUEST_SLEEPING, HOST_POLLING, HOST_READY, LENGTH, POSTED, STATE};
use enclave_proto::{EnclaveMessage, FileOp, HostMessage};

use crate::console::LogBook;
use crate::guest_ram::{BadAddress, GuestRam};

/// How long the pump naps briefly after the last request it served.
const POLL_WINDOW: Duration = Duration::from_millis(5);
/// How long it keeps polling at all, with longer naps after `POLL_WINDOW`: a job between two
/// file-heavy steps (a few ms of computing) still finds it awake.
const WATCH: Duration = Duration::from_secs(1);
const WATCH_NAP: Duration = Duration::from_micros(200);
/// For this long after a request the pump spins; then it sleeps [`POLL_NAP`] between looks:
/// on a loaded host a thread that spun through its share is scheduled last, and its next
/// wake-up on the doorbell comes late, while a napping one is run at once.
const SPIN: Duration = Duration::from_micros(50);
const POLL_NAP: Duration = Duration::from_micros(20);

/// The pump's nice value while it serves file calls (the daemon runs as root).
const PUMP_NICE: libc::c_int = -10;

/// The slots the kernel published, mapped.
pub struct Slots {
    gpa: u64,
    /// Whether the job's ring-3 calls are served too (`CLOWDER_RING3_FILES=off`: not; each
    /// then takes the kernel path, to compare the two).
    ring3: bool,
    /// Host address of the slot pages in the enclave's RAM mapping (it lives as long as the
    /// enclave, which owns both).
    base: usize,
    count: u16,
    /// When the pump last served a request, while it polls (`None`: it sleeps on the
    /// doorbell); kept across [`Slots::serve`], which returns to let the pump read the channel.
    last_served: Mutex<Option<Instant>>,
}

impl Slots {
    /// Whether this daemon serves file slots: not with `CLOWDER_FILE_SLOTS=off`.
    pub fn wanted() -> bool {
        std::env::var_os("CLOWDER_FILE_SLOTS").is_none_or(|value| value != "off")
    }

    /// Whether this daemon serves the jobs' ring-3 file calls: not with `CLOWDER_RING3_FILES=off`.
    pub fn ring3_wanted() -> bool {
        std::env::var_os("CLOWDER_RING3_FILES").is_none_or(|value| value != "off")
    }

    /// The slots at `gpa` (`FileSlots`), if they are RAM outside the channel.
    pub fn map(ram: &GuestRam, gpa: u64, count: u16) -> Result<Slots, String> {
        let span = slots::span(gpa, count).ok_or_else(|| format!("{count} file slots at {gpa:#x}: not page aligned or too many"))?;
        let (_, offset) = ram.file_range(gpa, span).map_err(|e: BadAddress| format!("file slots: {e}"))?;
        let base = ram.host_address(offset, span).ok_or("file slots outside the RAM mapping")? as usize;
        let slots = Slots { gpa, ring3: Slots::ring3_wanted(), base, count, last_served: Mutex::new(None) };
        slots.word(HOST_READY).store(1, Ordering::SeqCst);
        Ok(slots)
    }

    /// The word at `offset` from the control page.
    fn word(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: offsets of the layout, 8-byte aligned, inside the span `map` checked; the
        // mapping outlives `self` (both belong to the enclave), and the guest writes these
        // words concurrently: hence atomics.
        unsafe { &*((self.base + offset as usize) as *const AtomicU64) }
    }

    /// Whether the pump polls the slots (the kernel rings no doorbell for them meanwhile).
    pub fn polling(&self) -> bool {
        self.last_served.lock().unwrap().is_some()
    }

    /// No host serves the slots any more (the pump ends): the kernel keeps to the channel.
    pub fn stop(&self) {
        self.word(HOST_READY).store(0, Ordering::SeqCst);
    }

    /// Serves every posted request with `answer_of` (the kernel's and the ring-3 calls),
    /// raising the channel interrupt with `kick` for a kernel that waits halted; then keeps
    /// polling until [`WATCH`] has passed since the last, or until `channel_waiting` says the
    /// pump has something else to read (it calls this again after: [`Slots::polling`]).
    pub fn serve(
        &self,
        ram: &GuestRam,
        log: &LogBook,
        answer_of: &dyn Fn(u32, u32, &FileOp<'_>) -> HostMessage<'static>,
        kick: &dyn Fn(),
        channel_waiting: &mut dyn FnMut() -> bool,
    ) {
        let polling = self.word(HOST_POLLING);
        // SAFETY: prctl with integer arguments; it changes this thread's timer slack only.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        // The job waits, spinning on its own core, while the pump serves it: on a loaded host
        // core the pump's share decides a forwarded call's time (an 8 MiB write's copy ran at a
        // tenth of its idle rate at load 11). A higher weight serves it first; it naps or
        // sleeps when there is nothing to serve, so it takes no more than the job asks.
        // SAFETY: setpriority on this thread (tid 0: the caller) with integer arguments.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, PUMP_NICE) };
        let mut request = vec![0u8; DATA_CAPACITY];
        let mut answer = vec![0u8; DATA_CAPACITY];
        // Only the pump serves: the lock is never contended.
        let mut last_served = self.last_served.lock().unwrap();
        loop {
            let mut served = self.ring3 && ring3_files::serve_all(ram, self.gpa, self.count, answer_of);
            for index in 0..self.count {
                let slot = slots::slot_address(0, index);
                let (state, length) = (self.word(slot + STATE), self.word(slot + LENGTH));
                if state.load(Ordering::SeqCst) == POSTED {
                    let data = slots::slot_address(self.gpa, index) + DATA;
                    let answered = serve(ram, log, answer_of, data, length.load(Ordering::SeqCst), &mut request, &mut answer);
                    length.store(answered, Ordering::SeqCst);
                    state.store(ANSWERED, Ordering::SeqCst);
                    if self.word(slot + GUEST_SLEEPING).load(Ordering::SeqCst) != 0 {
                        kick();
                    }
                    served = true;
                }
            }
            let since = last_served.map(|at| at.elapsed());
            if served {
                polling.store(1, Ordering::SeqCst);
                if self.ring3 {
                    ring3_files::set_awake(ram, self.gpa, self.count, true);
                }
                *last_served = Some(Instant::now());
            } else if since.is_some_and(|since| since >= WATCH) {
                // Back to sleeping on the doorbell: say so, then look once more, so a post
                // made before the kernel read the flag is served here and one made after it
                // rings the doorbell (a ring-3 call made meanwhile waits briefly, then takes
                // the kernel path, which rings).
                polling.store(0, Ordering::SeqCst);
                if self.ring3 {
                    ring3_files::set_awake(ram, self.gpa, self.count, false);
                }
                *last_served = None;
            } else if since.is_none() || channel_waiting() {
                return;
            } else if since.is_some_and(|since| since < SPIN) {
                std::hint::spin_loop();
            } else if since.is_some_and(|since| since < POLL_WINDOW) {
                std::thread::sleep(POLL_NAP);
            } else {
                std::thread::sleep(WATCH_NAP);
            }
        }
    }
}

/// Serves the request of `length` bytes at guest-physical `data` (a slot's) and writes the
/// answer there; its length, 0 when there is none to give.
fn serve(
    ram: &GuestRam,
    log: &LogBook,
    answer_of: &dyn Fn(u32, u32, &FileOp<'_>) -> HostMessage<'static>,
    data: u64,
    length: u64,
    request: &mut [u8],
    answer: &mut [u8],
) -> u64 {
    let encoded = match usize::try_from(length).unwrap_or(usize::MAX) {
        length @ 1..=DATA_CAPACITY if ram.read(data, &mut request[..length]).is_ok() => match EnclaveMessage::decode(&request[..length]) {
            Ok(EnclaveMessage::FileRequest { job, request, op }) => answer_of(job, request, &op).encode(answer).ok(),
            Ok(other) => {
                log.push(format!("clowderd: {other:?} in a file slot; only FileRequest belongs there"));
                None
            }
            Err(e) => {
                log.push(format!("clowderd: malformed request in a file slot ({e})"));
                None
            }
        },
        _ => {
            log.push(format!("clowderd: a file slot's request of {length} bytes (at most {DATA_CAPACITY})"));
            None
        }
    };
    match encoded {
        Some(n) if ram.write(data, &answer[..n]).is_ok() => n as u64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_ram::RamRange;
    use enclave_proto::slots::FREE;
    use std::cell::Cell;

    const RAM: u64 = 1 << 20;
    const SLOTS: u64 = 0x10000;
    const CHANNEL: (u64, u64) = (RAM - 0x4000, 0x4000);

    fn ram() -> GuestRam {
        let memfd = crate::sys::memfd("file-slots-test").unwrap();
        memfd.set_len(RAM).unwrap();
        GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: RAM, file_offset: 0 }], CHANNEL).unwrap()
    }

    fn word(ram: &GuestRam, gpa: u64) -> u64 {
        let mut bytes = [0u8; 8];
        ram.read(gpa, &mut bytes).unwrap();
        u64::from_le_bytes(bytes)
    }

    /// Puts `bytes` in slot `index` as a request of `length` bytes, posted.
    fn post(ram: &GuestRam, index: u16, bytes: &[u8], length: u64, sleeping: bool) {
        let slot = slots::slot_address(SLOTS, index);
        ram.write(slot + DATA, bytes).unwrap();
        ram.write(slot + LENGTH, &length.to_le_bytes()).unwrap();
        ram.write(slot + GUEST_SLEEPING, &(sleeping as u64).to_le_bytes()).unwrap();
        ram.write(slot + STATE, &POSTED.to_le_bytes()).unwrap();
    }

    fn request(job: u32, request: u32, op: FileOp<'_>) -> Vec<u8> {
        let mut bytes = vec![0u8; DATA_CAPACITY];
        let length = EnclaveMessage::FileRequest { job, request, op }.encode(&mut bytes).unwrap();
        bytes.truncate(length);
        bytes
    }

    /// The answer in slot `index`, decoded, once it is answered.
    fn answer(ram: &GuestRam, index: u16) -> Option<(u32, i64)> {
        let slot = slots::slot_address(SLOTS, index);
        assert_eq!(word(ram, slot + STATE), ANSWERED);
        let length = word(ram, slot + LENGTH) as usize;
        let mut bytes = vec![0u8; length];
        ram.read(slot + DATA, &mut bytes).unwrap();
        match HostMessage::decode(&bytes) {
            Ok(HostMessage::FileResult { request, result, .. }) => Some((request, result)),
            _ => None,
        }
    }

    fn reply(job: u32, request: u32, op: &FileOp<'_>) -> HostMessage<'static> {
        let result = match op {
            FileOp::Close { handle } => *handle as i64,
            _ => -(libc::ENOSYS as i64),
        };
        HostMessage::FileResult { job, request, result }
    }

    #[test]
    fn posted_requests_are_answered_in_their_slots_and_halted_kernels_woken() {
        let ram = ram();
        let slots = Slots::map(&ram, SLOTS, 3).unwrap();
        assert_eq!(word(&ram, SLOTS + HOST_READY), 1, "the kernel may use them");
        let close = request(7, 41, FileOp::Close { handle: 5 });
        post(&ram, 0, &close, close.len() as u64, false);
        let stat = request(7, 42, FileOp::Stat { path: b"x" });
        post(&ram, 2, &stat, stat.len() as u64, true);
        let kicks = Cell::new(0);
        let log = LogBook::new(16);
        slots.serve(&ram, &log, &reply, &|| kicks.set(kicks.get() + 1), &mut || false);
        assert_eq!(answer(&ram, 0), Some((41, 5)));
        assert_eq!(answer(&ram, 2), Some((42, -(libc::ENOSYS as i64))));
        assert_eq!(kicks.get(), 1, "only the halted kernel is woken");
        assert_eq!(word(&ram, slots::slot_address(SLOTS, 1) + STATE), FREE, "an idle slot is left alone");
        assert_eq!(word(&ram, SLOTS + HOST_POLLING), 0, "asleep again: the kernel rings");
        slots.stop();
        assert_eq!(word(&ram, SLOTS + HOST_READY), 0);
    }

    /// Polling stops while the channel has something for the pump, and goes on after: the
    /// kernel is told the host still polls, and the pump comes back without waiting.
    #[test]
    fn polling_gives_way_to_the_channel_and_goes_on_after() {
        let ram = ram();
        let slots = Slots::map(&ram, SLOTS, 1).unwrap();
        let log = LogBook::new(16);
        let close = request(7, 41, FileOp::Close { handle: 5 });
        post(&ram, 0, &close, close.len() as u64, false);
        let started = Instant::now();
        slots.serve(&ram, &log, &reply, &|| {}, &mut || true);
        assert!(started.elapsed() < WATCH / 2, "returned for the channel after {:?}", started.elapsed());
        assert_eq!(answer(&ram, 0), Some((41, 5)), "the posted request was served first");
        assert!(slots.polling());
        assert_eq!(word(&ram, SLOTS + HOST_POLLING), 1, "the kernel need not ring");
        ram.write(slots::slot_address(SLOTS, 0) + STATE, &FREE.to_le_bytes()).unwrap();
        let looks = Cell::new(0);
        slots.serve(&ram, &log, &reply, &|| {}, &mut || {
            looks.set(looks.get() + 1);
            false
        });
        assert!(started.elapsed() >= WATCH, "the watch goes on from the last request, not from the return");
        assert!(looks.get() > 0);
        assert!(!slots.polling());
        assert_eq!(word(&ram, SLOTS + HOST_POLLING), 0);
    }

    /// Whatever the guest writes, the slot gets an empty answer (EIO to the kernel) and the
    /// daemon goes on.
    #[test]
    fn malformed_requests_get_empty_answers() {
        let ram = ram();
        let slots = Slots::map(&ram, SLOTS, 1).unwrap();
        let good = request(1, 1, FileOp::Close { handle: 3 });
        let mut pong = [0u8; 16];
        let pong_length = EnclaveMessage::Pong { nonce: 9 }.encode(&mut pong).unwrap();
        let cases: [(&[u8], u64); 5] = [
            (&good, 0),
            (&good, DATA_CAPACITY as u64 + 1),
            (&good, u64::MAX),
            (&[0xff; 32], 32),
            (&pong[..pong_length], pong_length as u64),
        ];
        let log = LogBook::new(16);
        for (bytes, length) in cases {
            post(&ram, 0, bytes, length, false);
            slots.serve(&ram, &log, &reply, &|| {}, &mut || false);
            assert_eq!(answer(&ram, 0), None, "{length} bytes");
            assert_eq!(word(&ram, slots::slot_address(SLOTS, 0) + LENGTH), 0);
        }
        post(&ram, 0, &good, good.len() as u64, false);
        slots.serve(&ram, &log, &reply, &|| {}, &mut || false);
        assert_eq!(answer(&ram, 0), Some((1, 3)), "still serving");
    }

    #[test]
    fn slots_must_be_aligned_ram_outside_the_channel() {
        let ram = ram();
        assert!(Slots::map(&ram, SLOTS + 8, 1).is_err(), "unaligned");
        assert!(Slots::map(&ram, SLOTS, 0).is_err(), "none");
        assert!(Slots::map(&ram, SLOTS, slots::MAX_SLOTS + 1).is_err(), "too many");
        assert!(Slots::map(&ram, RAM - 0x2000, 1).is_err(), "over the channel");
        assert!(Slots::map(&ram, RAM, 1).is_err(), "past RAM");
        assert!(Slots::map(&ram, !0xfff, 1).is_err(), "wrapping");
    }
}
