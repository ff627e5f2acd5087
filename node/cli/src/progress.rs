//! The progress line of `clowder enclave create`: how far the daemon got populating the
//! enclave's memory. On a terminal one line is rewritten in place (`\r`); elsewhere (a log, a
//! pipe) each report is a line of its own, since a `\r` there would only garble the file.

use std::io::Write;

pub struct ProgressLine<W: Write> {
    out: W,
    terminal: bool,
    /// A rewritten line is showing and needs its newline before anything else is printed.
    open: bool,
}

impl<W: Write> ProgressLine<W> {
    pub fn new(out: W, terminal: bool) -> ProgressLine<W> {
        ProgressLine { out, terminal, open: false }
    }

    /// Shows one report; a stderr that cannot be written to loses only the progress line.
    pub fn show(&mut self, done_mib: u64, total_mib: u64, elapsed_ms: u64) {
        let percent = (done_mib * 100).checked_div(total_mib).unwrap_or(100).min(100);
        let text = format!("populating memory: {done_mib} of {total_mib} MiB ({percent}%) in {:.1} s", elapsed_ms as f64 / 1000.0);
        let _ = if self.terminal {
            self.open = true;
            // `\x1b[K` clears what a longer earlier line left at the end.
            write!(self.out, "\rclowder: {text}\x1b[K")
        } else {
            writeln!(self.out, "clowder: {text}")
        };
        let _ = self.out.flush();
    }

    /// Ends a rewritten line, so that what follows starts on a line of its own.
    pub fn finish(&mut self) {
        if std::mem::take(&mut self.open) {
            let _ = writeln!(self.out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_gets_one_rewritten_line_and_a_log_a_line_per_report() {
        let mut terminal = ProgressLine::new(Vec::new(), true);
        terminal.show(1024, 4096, 1500);
        terminal.show(4096, 4096, 4000);
        terminal.finish();
        terminal.finish();
        let text = String::from_utf8(terminal.out).unwrap();
        assert_eq!(
            text,
            "\rclowder: populating memory: 1024 of 4096 MiB (25%) in 1.5 s\x1b[K\
             \rclowder: populating memory: 4096 of 4096 MiB (100%) in 4.0 s\x1b[K\n"
        );
        let mut log = ProgressLine::new(Vec::new(), false);
        log.show(1024, 4096, 1500);
        log.show(4096, 0, 4000);
        log.finish();
        let text = String::from_utf8(log.out).unwrap();
        assert_eq!(
            text,
            "clowder: populating memory: 1024 of 4096 MiB (25%) in 1.5 s\n\
             clowder: populating memory: 4096 of 0 MiB (100%) in 4.0 s\n"
        );
    }
}
