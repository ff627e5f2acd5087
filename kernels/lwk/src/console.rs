//! Kernel messages and job output share COM1. Kernel lines start with `[lwk] ` so tests can
//! separate them from the job's bytes; a kernel line that would land in the middle of a job's
//! unfinished line starts on a new line.

use crate::arch::serial;
use crate::arch::sync::SpinLock;
use core::fmt::{self, Write};

struct Console {
    at_line_start: bool,
}

static CONSOLE: SpinLock<Console> = SpinLock::new(Console { at_line_start: true });

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
    CONSOLE.lock().write_bytes(bytes);
}

pub fn print_kernel_line(arguments: fmt::Arguments) {
    let mut console = CONSOLE.lock();
    emit_kernel_line(&mut console, arguments);
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
