//! Primitive encoding: little-endian integers, length-prefixed byte strings and lists, read and
//! written with bounds checks on every step.

use core::fmt;
use core::marker::PhantomData;

/// Why bytes could not be decoded into a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ended inside `field`.
    Truncated {
        field: &'static str,
    },
    /// A message kind this side does not know (or one meant for the other direction).
    UnknownKind(u16),
    UnknownFileOp(u8),
    UnknownStream(u8),
    /// A yes-or-no byte that is neither 0 nor 1.
    NotABool {
        field: &'static str,
    },
    /// A C string (argv, env, path, name) holds a NUL byte.
    ContainsNul {
        field: &'static str,
    },
    /// A string that must not be empty (a path, a file name) is.
    Empty {
        field: &'static str,
    },
    /// Bytes left over after the last field.
    TrailingBytes {
        count: usize,
    },
}

/// Why a message could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer is too small; `needed_at_least` bytes would be a start.
    BufferTooSmall {
        needed_at_least: usize,
    },
    /// A byte string or list longer than a u32 length can say.
    TooLong {
        field: &'static str,
    },
    ContainsNul {
        field: &'static str,
    },
    Empty {
        field: &'static str,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { field } => write!(f, "message truncated in `{field}`"),
            DecodeError::UnknownKind(kind) => write!(f, "unknown message kind {kind:#06x}"),
            DecodeError::UnknownFileOp(op) => write!(f, "unknown file operation {op}"),
            DecodeError::UnknownStream(stream) => write!(f, "unknown output stream {stream}"),
            DecodeError::NotABool { field } => write!(f, "{field} is neither 0 nor 1"),
            DecodeError::ContainsNul { field } => write!(f, "`{field}` contains a NUL byte"),
            DecodeError::Empty { field } => write!(f, "`{field}` is empty"),
            DecodeError::TrailingBytes { count } => write!(f, "{count} bytes after the last field"),
        }
    }
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferTooSmall { needed_at_least } => {
                write!(f, "output buffer too small (needs at least {needed_at_least} bytes)")
            }
            EncodeError::TooLong { field } => write!(f, "`{field}` longer than 2^32-1 bytes or items"),
            EncodeError::ContainsNul { field } => write!(f, "`{field}` contains a NUL byte"),
            EncodeError::Empty { field } => write!(f, "`{field}` is empty"),
        }
    }
}

/// Reads fields off the front of a byte slice; every read checks the remaining length.
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, position: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// Succeeds only if every byte was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes { count }),
        }
    }

    pub fn take(&mut self, count: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if count > self.remaining() {
            return Err(DecodeError::Truncated { field });
        }
        let taken = &self.bytes[self.position..self.position + count];
        self.position += count;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N, field)?);
        Ok(array)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// A byte that must be 0 (false) or 1 (true), so that every message has one encoding.
    pub fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::NotABool { field }),
        }
    }

    pub fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_le_bytes)
    }
    pub fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_le_bytes)
    }
    pub fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.array(field).map(u64::from_le_bytes)
    }
    pub fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.array(field).map(i32::from_le_bytes)
    }
    pub fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_le_bytes)
    }

    /// A u32 length, then that many bytes.
    pub fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let length = self.u32(field)? as usize;
        self.take(length, field)
    }

    /// Like [`Reader::bytes`], for a C string: no NUL byte inside.
    pub fn c_string(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let text = self.bytes(field)?;
        if text.contains(&0) {
            return Err(DecodeError::ContainsNul { field });
        }
        Ok(text)
    }

    /// A C string that must not be empty (paths, names).
    pub fn name(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let text = self.c_string(field)?;
        if text.is_empty() {
            return Err(DecodeError::Empty { field });
        }
        Ok(text)
    }
}

/// Writes fields into a caller's buffer; running out of room is an error, never a panic.
pub struct Writer<'b> {
    out: &'b mut [u8],
    position: usize,
}

impl<'b> Writer<'b> {
    pub fn new(out: &'b mut [u8]) -> Writer<'b> {
        Writer { out, position: 0 }
    }

    pub fn written(&self) -> usize {
        self.position
    }

    pub fn put(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        let end = self.position.checked_add(bytes.len());
        match end {
            Some(end) if end <= self.out.len() => {
                self.out[self.position..end].copy_from_slice(bytes);
                self.position = end;
                Ok(())
            }
            _ => Err(EncodeError::BufferTooSmall { needed_at_least: self.position.saturating_add(bytes.len()) }),
        }
    }

    pub fn u8(&mut self, value: u8) -> Result<(), EncodeError> {
        self.put(&[value])
    }
    pub fn u16(&mut self, value: u16) -> Result<(), EncodeError> {
        self.put(&value.to_le_bytes())
    }
    pub fn u32(&mut self, value: u32) -> Result<(), EncodeError> {
        self.put(&value.to_le_bytes())
    }
    pub fn u64(&mut self, value: u64) -> Result<(), EncodeError> {
        self.put(&value.to_le_bytes())
    }
    pub fn i32(&mut self, value: i32) -> Result<(), EncodeError> {
        self.put(&value.to_le_bytes())
    }
    pub fn i64(&mut self, value: i64) -> Result<(), EncodeError> {
        self.put(&value.to_le_bytes())
    }

    pub fn length(&mut self, length: usize, field: &'static str) -> Result<(), EncodeError> {
        let length = u32::try_from(length).map_err(|_| EncodeError::TooLong { field })?;
        self.u32(length)
    }

    pub fn bytes(&mut self, bytes: &[u8], field: &'static str) -> Result<(), EncodeError> {
        self.length(bytes.len(), field)?;
        self.put(bytes)
    }

    pub fn c_string(&mut self, text: &[u8], field: &'static str) -> Result<(), EncodeError> {
        if text.contains(&0) {
            return Err(EncodeError::ContainsNul { field });
        }
        self.bytes(text, field)
    }

    pub fn name(&mut self, text: &[u8], field: &'static str) -> Result<(), EncodeError> {
        if text.is_empty() {
            return Err(EncodeError::Empty { field });
        }
        self.c_string(text, field)
    }
}

/// Something a [`List`] holds.
pub trait Item<'a>: Copy + 'a {
    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError>;
    fn read(reader: &mut Reader<'a>) -> Result<Self, DecodeError>;
}

/// Argument and environment strings: C strings (may be empty, no NUL).
impl<'a> Item<'a> for &'a [u8] {
    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.c_string(self, "string")
    }
    fn read(reader: &mut Reader<'a>) -> Result<Self, DecodeError> {
        reader.c_string("string")
    }
}

/// A list on the wire: a u32 count, then the items. A sender builds one from a slice
/// ([`List::new`]); a decoded one refers to the (already validated) bytes of the message, so
/// decoding allocates nothing.
#[derive(Clone, Copy)]
pub struct List<'a, T> {
    repr: ListRepr<'a, T>,
}

#[derive(Clone, Copy)]
enum ListRepr<'a, T> {
    Items(&'a [T]),
    Encoded { count: u32, bytes: &'a [u8], item: PhantomData<T> },
}

impl<'a, T: Item<'a>> List<'a, T> {
    pub fn new(items: &'a [T]) -> List<'a, T> {
        List { repr: ListRepr::Items(items) }
    }

    pub fn len(&self) -> usize {
        match self.repr {
            ListRepr::Items(items) => items.len(),
            ListRepr::Encoded { count, .. } => count as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> ListIter<'a, T> {
        match self.repr {
            ListRepr::Items(items) => ListIter { source: IterSource::Items(items.iter()) },
            ListRepr::Encoded { count, bytes, .. } => ListIter { source: IterSource::Encoded { left: count, reader: Reader::new(bytes) } },
        }
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>, field: &'static str) -> Result<(), EncodeError> {
        writer.length(self.len(), field)?;
        for item in self.iter() {
            item.write(writer)?;
        }
        Ok(())
    }

    /// Reads and validates every item now, so iterating later cannot fail. The work is bounded
    /// by the message length: each item takes at least one byte, so a huge count runs out of
    /// bytes quickly.
    pub(crate) fn read(reader: &mut Reader<'a>, field: &'static str) -> Result<List<'a, T>, DecodeError> {
        let count = reader.u32(field)?;
        let start = reader.position;
        for _ in 0..count {
            T::read(reader)?;
        }
        let bytes = &reader.bytes[start..reader.position];
        Ok(List { repr: ListRepr::Encoded { count, bytes, item: PhantomData } })
    }
}

impl<'a, T: Item<'a> + PartialEq> PartialEq for List<'a, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<'a, T: Item<'a> + Eq> Eq for List<'a, T> {}

impl<'a, T: Item<'a> + fmt::Debug> fmt::Debug for List<'a, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

pub struct ListIter<'a, T> {
    source: IterSource<'a, T>,
}

enum IterSource<'a, T> {
    Items(core::slice::Iter<'a, T>),
    Encoded { left: u32, reader: Reader<'a> },
}

impl<'a, T: Item<'a>> Iterator for ListIter<'a, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match &mut self.source {
            IterSource::Items(items) => items.next().copied(),
            IterSource::Encoded { left, reader } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // The bytes were validated when the list was decoded; an error here cannot
                // happen, and would end the iteration rather than panic.
                T::read(reader).ok()
            }
        }
    }
}
