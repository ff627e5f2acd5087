//! Fragmentation: a message longer than one ring slot travels as a run of frames.
//!
//! Every ring message (a *frame*) starts with one byte:
//!
//! | byte | frame | rest |
//! |------|-------|------|
//! | `1`  | whole | the complete encoded message |
//! | `2`  | start | u32 total message length, then the first piece |
//! | `3`  | continuation | the next piece; the message is complete when the pieces add up to the total |
//!
//! A sender emits the frames of one message back to back (each ring has a single producer, so
//! they are never interleaved with another message's). A `start` frame always carries a
//! non-empty piece and a total longer than that piece.

use core::fmt;

pub const FRAME_WHOLE: u8 = 1;
pub const FRAME_START: u8 = 2;
pub const FRAME_CONTINUATION: u8 = 3;
/// The frame byte plus a start frame's u32 total.
pub const START_OVERHEAD: usize = 5;
/// The longest message either side must accept after reassembly.
pub const MAX_MESSAGE_LEN: usize = 64 * 1024;
/// Frames must have room for a start frame's header and at least one byte of payload.
pub const MIN_FRAME_LEN: usize = START_OVERHEAD + 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// An empty ring message, or a continuation frame without payload.
    Empty,
    UnknownFrameKind(u8),
    /// A start frame's total is not above its own piece, or above the reassembly buffer.
    BadTotal {
        total: u32,
        capacity: usize,
    },
    /// A start frame's header is cut short.
    Truncated,
    /// A start or whole frame arrived while another message was half assembled.
    Interrupted,
    /// A continuation without a start.
    UnexpectedContinuation,
    /// More bytes than the start frame announced.
    Overrun,
    /// The message to send is longer than [`MAX_MESSAGE_LEN`].
    MessageTooLong {
        length: usize,
    },
    /// The ring's message size is below [`MIN_FRAME_LEN`].
    FrameTooSmall {
        max_frame_len: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Empty => write!(f, "empty frame"),
            FrameError::UnknownFrameKind(kind) => write!(f, "unknown frame kind {kind}"),
            FrameError::BadTotal { total, capacity } => {
                write!(f, "start frame announces {total} bytes (capacity {capacity})")
            }
            FrameError::Truncated => write!(f, "start frame shorter than its header"),
            FrameError::Interrupted => write!(f, "a new message started before the previous one was complete"),
            FrameError::UnexpectedContinuation => write!(f, "continuation frame without a start frame"),
            FrameError::Overrun => write!(f, "frames carry more bytes than announced"),
            FrameError::MessageTooLong { length } => {
                write!(f, "message of {length} bytes exceeds {MAX_MESSAGE_LEN}")
            }
            FrameError::FrameTooSmall { max_frame_len } => {
                write!(f, "ring messages of {max_frame_len} bytes are too small to carry frames")
            }
        }
    }
}

/// Cuts one encoded message into frames of at most `max_frame_len` bytes.
pub struct Fragmenter<'m> {
    message: &'m [u8],
    max_frame_len: usize,
    sent: usize,
    started: bool,
}

impl<'m> Fragmenter<'m> {
    pub fn new(message: &'m [u8], max_frame_len: usize) -> Result<Fragmenter<'m>, FrameError> {
        if max_frame_len < MIN_FRAME_LEN {
            return Err(FrameError::FrameTooSmall { max_frame_len });
        }
        if message.len() > MAX_MESSAGE_LEN {
            return Err(FrameError::MessageTooLong { length: message.len() });
        }
        Ok(Fragmenter { message, max_frame_len, sent: 0, started: false })
    }

    /// Writes the next frame into `out` (which must hold `max_frame_len` bytes) and returns its
    /// length, or `None` when the message has been sent completely.
    pub fn next_frame(&mut self, out: &mut [u8]) -> Option<usize> {
        let usable = self.max_frame_len.min(out.len());
        let out = &mut out[..usable];
        if !self.started {
            self.started = true;
            if self.message.len() < out.len() {
                out[0] = FRAME_WHOLE;
                out[1..1 + self.message.len()].copy_from_slice(self.message);
                self.sent = self.message.len();
                return Some(1 + self.message.len());
            }
            if out.len() < MIN_FRAME_LEN {
                return None;
            }
            out[0] = FRAME_START;
            // `new` bounded the length by MAX_MESSAGE_LEN, far below u32::MAX.
            out[1..START_OVERHEAD].copy_from_slice(&(self.message.len() as u32).to_le_bytes());
            let piece = out.len() - START_OVERHEAD;
            out[START_OVERHEAD..].copy_from_slice(&self.message[..piece]);
            self.sent = piece;
            return Some(out.len());
        }
        if self.sent == self.message.len() || out.len() < 2 {
            return None;
        }
        let piece = (out.len() - 1).min(self.message.len() - self.sent);
        out[0] = FRAME_CONTINUATION;
        out[1..1 + piece].copy_from_slice(&self.message[self.sent..self.sent + piece]);
        self.sent += piece;
        Some(1 + piece)
    }
}

/// Puts frames back together in a caller-provided buffer (no allocation, so the guest kernel
/// can keep one per channel).
pub struct Reassembler<'b> {
    buffer: &'b mut [u8],
    /// The announced total of the message being assembled; 0 when none is.
    expected: usize,
    filled: usize,
}

impl<'b> Reassembler<'b> {
    pub fn new(buffer: &'b mut [u8]) -> Reassembler<'b> {
        Reassembler { buffer, expected: 0, filled: 0 }
    }

    /// Whether a message is half assembled.
    pub fn in_progress(&self) -> bool {
        self.expected != 0
    }

    /// Forgets a half-assembled message (after an error, to resynchronise on the next start).
    pub fn reset(&mut self) {
        self.expected = 0;
        self.filled = 0;
    }

    /// Takes one frame; returns the complete message when this frame finished one. On error the
    /// partial message is dropped.
    pub fn push<'s>(&'s mut self, frame: &'s [u8]) -> Result<Option<&'s [u8]>, FrameError> {
        let result = self.accept(frame);
        if result.is_err() {
            self.reset();
        }
        match result? {
            Accepted::Whole => Ok(Some(&frame[1..])),
            Accepted::Partial => Ok(None),
            Accepted::Complete(length) => Ok(Some(&self.buffer[..length])),
        }
    }

    fn accept(&mut self, frame: &[u8]) -> Result<Accepted, FrameError> {
        let (&kind, rest) = frame.split_first().ok_or(FrameError::Empty)?;
        match kind {
            FRAME_WHOLE => {
                if self.in_progress() {
                    return Err(FrameError::Interrupted);
                }
                Ok(Accepted::Whole)
            }
            FRAME_START => {
                if self.in_progress() {
                    return Err(FrameError::Interrupted);
                }
                if rest.len() < START_OVERHEAD {
                    return Err(FrameError::Truncated);
                }
                let total = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let piece = &rest[4..];
                let capacity = self.buffer.len().min(MAX_MESSAGE_LEN);
                if total as usize <= piece.len() || total as usize > capacity {
                    return Err(FrameError::BadTotal { total, capacity });
                }
                self.buffer[..piece.len()].copy_from_slice(piece);
                self.expected = total as usize;
                self.filled = piece.len();
                Ok(Accepted::Partial)
            }
            FRAME_CONTINUATION => {
                if !self.in_progress() {
                    return Err(FrameError::UnexpectedContinuation);
                }
                if rest.is_empty() {
                    return Err(FrameError::Empty);
                }
                if rest.len() > self.expected - self.filled {
                    return Err(FrameError::Overrun);
                }
                self.buffer[self.filled..self.filled + rest.len()].copy_from_slice(rest);
                self.filled += rest.len();
                if self.filled < self.expected {
                    return Ok(Accepted::Partial);
                }
                let length = self.expected;
                self.expected = 0;
                self.filled = 0;
                Ok(Accepted::Complete(length))
            }
            other => Err(FrameError::UnknownFrameKind(other)),
        }
    }
}

enum Accepted {
    Whole,
    Partial,
    Complete(usize),
}
