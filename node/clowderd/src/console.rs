//! The LWK's serial console carries the job's output and the kernel's own lines (which start
//! with `[lwk] ` on a fresh line). [`ConsoleSplitter`] separates them as bytes arrive, holding
//! back only the few bytes that might still turn into a kernel line, so output streams at once.
//! [`LogBook`] keeps an enclave's recent log lines for `clowder logs`.

use std::collections::VecDeque;
use std::sync::Mutex;

pub const KERNEL_PREFIX: &[u8] = b"[lwk] ";
/// A kernel line is cut into pieces this long: the console is the guest's to write, and a
/// line that never ends must not grow the daemon's memory without bound.
pub const MAX_KERNEL_LINE: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Output(Vec<u8>),
    /// A kernel line without the prefix and the newline.
    KernelLine(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// At the start of a line: `pending` holds a possible prefix of a kernel line.
    LineStart,
    Output,
    Kernel,
}

pub struct ConsoleSplitter {
    mode: Mode,
    pending: Vec<u8>,
}

impl Default for ConsoleSplitter {
    fn default() -> Self {
        ConsoleSplitter { mode: Mode::LineStart, pending: Vec::new() }
    }
}

impl ConsoleSplitter {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let mut output = Vec::new();
        for &byte in bytes {
            match self.mode {
                Mode::Output => {
                    output.push(byte);
                    if byte == b'\n' {
                        self.mode = Mode::LineStart;
                    }
                }
                Mode::Kernel => {
                    if byte == b'\n' {
                        let line = String::from_utf8_lossy(&self.pending[KERNEL_PREFIX.len()..]).into_owned();
                        pieces.push(Piece::KernelLine(line.trim_end_matches('\r').to_string()));
                        self.pending.clear();
                        self.mode = Mode::LineStart;
                    } else {
                        self.pending.push(byte);
                        if self.pending.len() == KERNEL_PREFIX.len() + MAX_KERNEL_LINE {
                            let line = String::from_utf8_lossy(&self.pending[KERNEL_PREFIX.len()..]).into_owned();
                            pieces.push(Piece::KernelLine(line));
                            self.pending.truncate(KERNEL_PREFIX.len());
                        }
                    }
                }
                Mode::LineStart => {
                    self.pending.push(byte);
                    if self.pending == KERNEL_PREFIX {
                        if !output.is_empty() {
                            pieces.push(Piece::Output(std::mem::take(&mut output)));
                        }
                        self.mode = Mode::Kernel;
                    } else if !KERNEL_PREFIX.starts_with(&self.pending) {
                        output.append(&mut self.pending);
                        self.mode = if byte == b'\n' { Mode::LineStart } else { Mode::Output };
                    }
                }
            }
        }
        if !output.is_empty() {
            pieces.push(Piece::Output(output));
        }
        pieces
    }

    /// Whatever is held back when the console ends.
    pub fn finish(&mut self) -> Vec<Piece> {
        let pending = std::mem::take(&mut self.pending);
        let mode = std::mem::replace(&mut self.mode, Mode::LineStart);
        match mode {
            _ if pending.is_empty() => Vec::new(),
            Mode::Kernel => vec![Piece::KernelLine(String::from_utf8_lossy(&pending[KERNEL_PREFIX.len()..]).into_owned())],
            _ => vec![Piece::Output(pending)],
        }
    }
}

/// One line of a log, and the one user besides root who may read it, if it is private.
struct LogLine {
    reader: Option<u32>,
    text: String,
}

/// The most recent lines of an enclave's log. Lines about one user's job (its arguments) are
/// that user's: others who may read the enclave's log do not see them.
pub struct LogBook {
    lines: Mutex<VecDeque<LogLine>>,
    capacity: usize,
}

impl LogBook {
    pub fn new(capacity: usize) -> LogBook {
        LogBook { lines: Mutex::new(VecDeque::new()), capacity }
    }

    fn add(&self, reader: Option<u32>, text: String) {
        let mut lines = self.lines.lock().unwrap();
        if lines.len() == self.capacity {
            lines.pop_front();
        }
        lines.push_back(LogLine { reader, text });
    }

    pub fn push(&self, line: impl Into<String>) {
        self.add(None, line.into());
    }

    /// A line only `uid` and root may read.
    pub fn push_private(&self, uid: u32, line: impl Into<String>) {
        self.add(Some(uid), line.into());
    }

    /// Every line (root's view, and what the daemon quotes in its own errors).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().iter().map(|line| line.text.clone()).collect()
    }

    /// The lines `uid` may read: the shared ones and their own.
    pub fn lines_for(&self, uid: u32) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        let readable = |line: &&LogLine| uid == 0 || line.reader.is_none_or(|reader| reader == uid);
        lines.iter().filter(readable).map(|line| line.text.clone()).collect()
    }

    pub fn tail(&self, count: usize) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        lines.iter().skip(lines.len().saturating_sub(count)).map(|line| line.text.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<Piece> {
        let mut splitter = ConsoleSplitter::default();
        let mut pieces: Vec<Piece> = chunks.iter().flat_map(|chunk| splitter.push(chunk)).collect();
        pieces.extend(splitter.finish());
        pieces
    }

    #[test]
    fn kernel_lines_are_separated_from_output() {
        let pieces = split(&[b"[lwk] job starts\nhello\n[lw", b"k] job exited with status 3\n"]);
        assert_eq!(
            pieces,
            vec![
                Piece::KernelLine("job starts".into()),
                Piece::Output(b"hello\n".to_vec()),
                Piece::KernelLine("job exited with status 3".into()),
            ]
        );
    }

    #[test]
    fn output_is_not_held_back() {
        let mut splitter = ConsoleSplitter::default();
        assert_eq!(splitter.push(b"progress 1"), vec![Piece::Output(b"progress 1".to_vec())]);
        // Mid-line, a "[lwk] " is output, not a kernel line.
        assert_eq!(splitter.push(b" [lwk] x\n"), vec![Piece::Output(b" [lwk] x\n".to_vec())]);
        // At a line start, only a possible prefix waits.
        assert_eq!(splitter.push(b"[l"), vec![]);
        assert_eq!(splitter.push(b"ast\n"), vec![Piece::Output(b"[last\n".to_vec())]);
        assert_eq!(splitter.push(b"[lw"), vec![]);
        assert_eq!(splitter.finish(), vec![Piece::Output(b"[lw".to_vec())]);
    }

    #[test]
    fn a_kernel_line_without_end_is_cut_into_pieces() {
        let mut splitter = ConsoleSplitter::default();
        let mut pieces = splitter.push(b"[lwk] ");
        for _ in 0..3 * MAX_KERNEL_LINE / 1024 {
            pieces.extend(splitter.push(&[b'x'; 1024]));
        }
        let cut: Vec<Piece> = (0..3).map(|_| Piece::KernelLine("x".repeat(MAX_KERNEL_LINE))).collect();
        assert_eq!(pieces, cut);
        assert!(splitter.pending.len() <= KERNEL_PREFIX.len());
    }

    #[test]
    fn log_book_keeps_the_latest_lines() {
        let book = LogBook::new(2);
        book.push("a");
        book.push("b");
        book.push("c");
        assert_eq!(book.lines(), vec!["b", "c"]);
        assert_eq!(book.tail(1), vec!["c"]);
    }

    #[test]
    fn private_lines_are_for_their_reader_and_root() {
        let book = LogBook::new(10);
        book.push("enclave ready");
        book.push_private(1000, "launched job 1: ./a secret");
        assert_eq!(book.lines_for(1000), vec!["enclave ready", "launched job 1: ./a secret"]);
        assert_eq!(book.lines_for(1001), vec!["enclave ready"]);
        assert_eq!(book.lines_for(0).len(), 2);
    }
}
