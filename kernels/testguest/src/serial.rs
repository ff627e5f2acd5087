//! Output on COM1, one line at a time under a lock (several vCPUs print at once in `smp`).
//!
//! No line-status polling: the VMM's 16550 and QEMU's accept every byte at once, and each extra
//! port access is another exit (~9 us on PVM).

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use crate::arch;

static LOCK: AtomicBool = AtomicBool::new(false);

struct Com1;

impl Write for Com1 {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        guest_arch::com1_write(text.as_bytes());
        Ok(())
    }
}

/// Prints one formatted line (the macro appends the newline) without interleaving with other
/// vCPUs' lines.
pub fn print_line(arguments: fmt::Arguments) {
    while LOCK.swap(true, Ordering::Acquire) {
        arch::pause();
    }
    let _ = Com1.write_fmt(arguments);
    let _ = Com1.write_str("\n");
    LOCK.store(false, Ordering::Release);
}

#[macro_export]
macro_rules! println {
    ($($argument:tt)*) => { $crate::serial::print_line(format_args!($($argument)*)) };
}
