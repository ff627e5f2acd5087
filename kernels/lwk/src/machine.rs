//! Leaving the VM: the exit device turns a status into the VM's exit status.

use crate::arch::cpu;
use core::sync::atomic::{AtomicU16, Ordering};

/// A kernel panic ends the VM with this status (a job's own status is 0..=255 too, so the
/// `[lwk] panic` line on the console is what tells them apart for sure).
pub const PANIC_STATUS: u8 = 254;
/// A one-shot job that cannot start (not a program this kernel runs, too little memory) ends
/// the VM with this status, a shell's for a command it cannot execute, after a `[lwk] cannot
/// start the job: ...` line.
pub const CANNOT_START_STATUS: u8 = 126;

static EXIT_PORT: AtomicU16 = AtomicU16::new(crate::cmdline::DEFAULT_EXIT_PORT);

pub fn set_exit_port(port: u16) {
    EXIT_PORT.store(port, Ordering::Relaxed);
}

pub fn exit(status: u8) -> ! {
    cpu::outl(EXIT_PORT.load(Ordering::Relaxed), status as u32);
    // Without an exit device (a machine that ignores the port) stop here.
    cpu::halt_forever()
}
