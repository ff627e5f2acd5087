//! Kernel messages and job output share COM1. Kernel lines start with `[lwk] ` so tests can
//! separate them from the job's bytes; a kernel line that would land in the middle of a job's
//! unfinished line starts on a new line.

use crate::arch::serial;
use crate::arch::sync::SpinLock;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicUsize, Ordering};

struct Console {
    at_line_start: bool,
}

static CONSOLE: SpinLock<Console> = SpinLock::new(Console { at_line_start: true });
/// The CPU that holds `CONSOLE` (`NO_CPU`: none). A kernel fault taken while its CPU prints
/// reports itself: waiting for the lock there would wait for itself for ever.
static OWNER: AtomicUsize = AtomicUsize::new(NO_CPU);
const NO_CPU: usize = usize::MAX;

/// Runs `print` with the console: under its lock, or beside it on a CPU that already holds
/// it (the lock's own print was interrupted by a fault there, and never resumes if the fault
/// is fatal).
fn with_console(print: impl FnOnce(&mut Console)) {
    let cpu = crate::arch::tables::current_cpu();
    if OWNER.load(Ordering::Relaxed) == cpu {
        return print(&mut Console { at_line_start: false });
    }
    let mut console = CONSOLE.lock();
    OWNER.store(cpu, Ordering::Relaxed);
    print(&mut console);
    OWNER.store(NO_CPU, Ordering::Relaxed);
}

impl Console {
    fn write_bytes(&mut self, bytes: &[u8]) {
        if let Some(&last) = bytes.last() {
            serial::write(bytes);
            self.at_line_start = last == b'\n';
        }
    }
}

impl Write for Console {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.write_bytes(text.as_bytes());
        Ok(())
    }
}

/// Job output (stdout, stderr), passed through unchanged.
pub fn write_job_output(bytes: &[u8]) {
    with_console(|console| console.write_bytes(bytes));
}

pub fn print_kernel_line(arguments: fmt::Arguments) {
    with_console(|console| emit_kernel_line(console, arguments));
}

/// The panic path: prints even if the console lock was held when the panic struck.
pub fn print_kernel_line_in_panic(arguments: fmt::Arguments) {
    match CONSOLE.try_lock() {
        Some(mut console) => emit_kernel_line(&mut console, arguments),
        None => emit_kernel_line(&mut Console { at_line_start: false }, arguments),
    }
}

fn emit_kernel_line(console: &mut Console, arguments: fmt::Arguments) {
    if !console.at_line_start {
        console.write_bytes(b"\n");
    }
    let _ = console.write_str("[lwk] ");
    let _ = console.write_fmt(arguments);
    console.write_bytes(b"\n");
}

/// Prints one kernel line: `log!("loaded {} bytes", n)`.
macro_rules! log {
    ($($argument:tt)*) => { $crate::console::print_kernel_line(format_args!($($argument)*)) };
}
pub(crate) use log;
