//! The attachment board (`xemem::pci::BOARD_*`; libxpmem's side is xemem/src/pci_board.c): a
//! shared file in which every guest process notes the window placements it attached, with its
//! pid and start time, by plain stores. The agent reads it only when the daemon reports a touch
//! of a revoked placement, to find the processes to SIGBUS. A message to the keeper per attach
//! and detach did the same before, but each woke the agent: 2-50 ms of emulated guest kernel
//! per attach on a PVM host, where the attach itself is a 0.4 ms mailbox exit.
//!
//! Nothing on the board is trusted beyond naming guest processes (the guest is one trust
//! domain, the file is root's): a slot is read whole or skipped (its generation is odd while it
//! is written, and must not move while it is read), a placement's range is checked for
//! overflow, and a process is signalled only if its pid still has the start time noted (so a
//! pid taken over by a later process is never signalled); slots of processes that are gone are
//! freed here.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use xemem::pci::{BOARD_GENERATION_AT, BOARD_LEN_AT, BOARD_OFFSET_AT, BOARD_PID_AT, BOARD_SLOTS, BOARD_SLOT_SIZE, BOARD_START_AT};

/// Where libxpmem and the agent find the board (libxpmem: `CLOWDER_XEMEM_PCI_BOARD`).
pub const PATH: &str = "/run/xemem-pci.attachments";
const SIZE: usize = (BOARD_SLOTS * BOARD_SLOT_SIZE) as usize;
/// Reads of a slot that keeps changing before it is skipped.
const READ_TRIES: usize = 8;

/// One attachment as read off the board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noted {
    /// Which slot, and its generation: together they name one attachment.
    pub slot: usize,
    pub generation: u32,
    pub pid: u32,
    pub start: u64,
}

/// The board, mapped shared.
pub struct Board {
    base: *mut u8,
}

// SAFETY: the mapping lives as long as the value and is only accessed atomically.
unsafe impl Send for Board {}
// SAFETY: as for Send.
unsafe impl Sync for Board {}

impl Board {
    /// Opens (making it if need be) and maps the board at `path`.
    pub fn open(path: &str) -> std::io::Result<Board> {
        Ok(Board { base: crate::xemem_keeper::map_file(path, SIZE, true)? })
    }

    fn word32(&self, slot: usize, at: u64) -> &AtomicU32 {
        // SAFETY: slot < BOARD_SLOTS and `at` is a 4-aligned field offset inside a slot, so
        // the word lies in the live mapping.
        unsafe { &*self.base.add(slot * BOARD_SLOT_SIZE as usize + at as usize).cast::<AtomicU32>() }
    }

    fn word64(&self, slot: usize, at: u64) -> &AtomicU64 {
        // SAFETY: as in `word32`, 8-aligned.
        unsafe { &*self.base.add(slot * BOARD_SLOT_SIZE as usize + at as usize).cast::<AtomicU64>() }
    }

    /// Slot `slot` read whole: `None` when free, or when it kept changing.
    fn read(&self, slot: usize) -> Option<(Noted, u64, u64)> {
        for _ in 0..READ_TRIES {
            let generation = self.word32(slot, BOARD_GENERATION_AT).load(Ordering::Acquire);
            if generation % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let pid = self.word32(slot, BOARD_PID_AT).load(Ordering::Acquire);
            let start = self.word64(slot, BOARD_START_AT).load(Ordering::Relaxed);
            let offset = self.word64(slot, BOARD_OFFSET_AT).load(Ordering::Relaxed);
            let len = self.word64(slot, BOARD_LEN_AT).load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if self.word32(slot, BOARD_GENERATION_AT).load(Ordering::Relaxed) != generation
                || self.word32(slot, BOARD_PID_AT).load(Ordering::Relaxed) != pid
            {
                continue;
            }
            return (pid != 0).then_some((Noted { slot, generation, pid, start }, offset, len));
        }
        None
    }

    /// The attachments noted on a placement holding `window_offset`.
    pub fn attachers(&self, window_offset: u64) -> Vec<Noted> {
        (0..BOARD_SLOTS as usize)
            .filter_map(|slot| self.read(slot))
            .filter(|(_, offset, len)| *len > 0 && offset.checked_add(*len).is_some_and(|end| (*offset..end).contains(&window_offset)))
            .map(|(noted, _, _)| noted)
            .collect()
    }

    /// Frees `noted`'s slot (its process is gone), unless it changed since it was read.
    pub fn free(&self, noted: Noted) {
        let generation = self.word32(noted.slot, BOARD_GENERATION_AT);
        if generation.compare_exchange(noted.generation, noted.generation.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        for at in [BOARD_START_AT, BOARD_OFFSET_AT, BOARD_LEN_AT] {
            self.word64(noted.slot, at).store(0, Ordering::Relaxed);
        }
        generation.store(noted.generation.wrapping_add(2), Ordering::Release);
        let _ = self.word32(noted.slot, BOARD_PID_AT).compare_exchange(noted.pid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of SIZE bytes, no longer referenced.
        unsafe { libc::munmap(self.base.cast(), SIZE) };
    }
}

/// A process's start time (field 22 of /proc/PID/stat, clock ticks after boot), as libxpmem
/// notes it: `None` if the process is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields count from its last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use clowder_test_support::TempDir;

    /// A board in a scratch directory of its own (`name`: the test's).
    pub(crate) fn board(name: &str) -> (Board, TempDir) {
        let dir = TempDir::new(&format!("agent-board-{name}"));
        (Board::open(dir.0.join("board").to_str().unwrap()).unwrap(), dir)
    }

    /// Notes an attachment as libxpmem does (pci_board.c's `pci_board_note`).
    pub(crate) fn note(board: &Board, slot: usize, pid: u32, start: u64, offset: u64, len: u64) {
        board.word32(slot, BOARD_PID_AT).compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).unwrap();
        board.word32(slot, BOARD_GENERATION_AT).fetch_add(1, Ordering::AcqRel);
        board.word64(slot, BOARD_START_AT).store(start, Ordering::Relaxed);
        board.word64(slot, BOARD_OFFSET_AT).store(offset, Ordering::Relaxed);
        board.word64(slot, BOARD_LEN_AT).store(len, Ordering::Relaxed);
        board.word32(slot, BOARD_GENERATION_AT).fetch_add(1, Ordering::AcqRel);
    }

    #[test]
    fn attachers_are_the_slots_whose_placement_holds_the_offset() {
        let (board, _dir) = board("attachers");
        note(&board, 0, 100, 7, 0x20_0000, 0x1000);
        note(&board, 5, 200, 8, 0x20_0000, 0x20_0000);
        note(&board, 4095, 300, 9, 0x40_0000, 0x1000);
        let pids = |offset| board.attachers(offset).iter().map(|n| n.pid).collect::<Vec<_>>();
        assert_eq!(pids(0x20_0000), [100, 200]);
        assert_eq!(pids(0x20_1000), [200], "past the first placement's end");
        assert_eq!(pids(0x40_0000), [300]);
        assert!(pids(0x60_0000).is_empty());
        assert_eq!(board.attachers(0x40_0000)[0].start, 9);
    }

    #[test]
    fn garbage_and_half_written_slots_are_skipped() {
        let (board, _dir) = board("garbage");
        note(&board, 1, 100, 7, u64::MAX - 0x10, 0x1000);
        note(&board, 2, 100, 7, 0x1000, 0);
        note(&board, 3, 100, 7, 0x1000, 0x1000);
        assert!(board.attachers(u64::MAX - 0x8).is_empty(), "a range that overflows");
        assert_eq!(board.attachers(0x1000).len(), 1, "no length: not a placement");
        // A slot being written (odd generation) is not read.
        board.word32(3, BOARD_GENERATION_AT).fetch_add(1, Ordering::AcqRel);
        assert!(board.attachers(0x1000).is_empty());
    }

    #[test]
    fn freeing_a_slot_that_changed_since_it_was_read_leaves_it() {
        let (board, _dir) = board("free");
        note(&board, 0, 100, 7, 0x1000, 0x1000);
        let noted = board.attachers(0x1000)[0];
        board.free(noted);
        assert!(board.attachers(0x1000).is_empty());
        note(&board, 0, 200, 8, 0x1000, 0x1000);
        board.free(noted);
        assert_eq!(board.attachers(0x1000)[0].pid, 200, "another process's attachment since");
    }

    #[test]
    fn start_times_name_live_processes() {
        let me = std::process::id();
        let start = start_time(me).unwrap();
        assert!(start > 0);
        assert_eq!(start_time(me), Some(start));
        assert_eq!(start_time(u32::MAX), None);
    }
}
