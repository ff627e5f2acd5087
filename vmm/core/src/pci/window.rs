//! The XEMEM device's BAR window: where the host places attached segments in guest-physical
//! space. Each attachment is one contiguous placement, backed by one KVM memory slot (not a slot
//! or a mapping per page: the cost the XEMEM paper measured for Palacios's page-by-page path).
//! Placements are aligned to 2 MiB so the guest and KVM can map them with huge pages.

use std::collections::BTreeMap;

/// Placement alignment (a huge page).
pub const PLACEMENT_ALIGN: u64 = 2 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowError {
    /// Zero or past the window.
    BadLength(u64),
    /// No free range of that length is left.
    Full(u64),
    /// No placement starts at that offset.
    NotPlaced(u64),
}

impl std::fmt::Display for WindowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WindowError::BadLength(len) => write!(f, "a placement of {len:#x} bytes does not fit the BAR window"),
            WindowError::Full(len) => write!(f, "no free range of {len:#x} bytes is left in the BAR window"),
            WindowError::NotPlaced(offset) => write!(f, "nothing is placed at offset {offset:#x} of the BAR window"),
        }
    }
}

impl std::error::Error for WindowError {}

/// The window's placements: offset to (length, the caller's tag, e.g. the memory slot).
#[derive(Debug)]
pub struct Window<T> {
    size: u64,
    placed: BTreeMap<u64, (u64, T)>,
}

impl<T> Window<T> {
    pub fn new(size: u64) -> Window<T> {
        Window { size, placed: BTreeMap::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.placed.is_empty()
    }

    /// Places `len` bytes (rounded up to the alignment) at the lowest free aligned offset.
    pub fn place(&mut self, len: u64, tag: T) -> Result<u64, WindowError> {
        let rounded = len.checked_next_multiple_of(PLACEMENT_ALIGN).filter(|&r| len > 0 && r <= self.size);
        let rounded = rounded.ok_or(WindowError::BadLength(len))?;
        let mut candidate = 0u64;
        for (&offset, &(placed_len, _)) in &self.placed {
            if offset - candidate >= rounded {
                break;
            }
            candidate = (offset + placed_len).next_multiple_of(PLACEMENT_ALIGN);
        }
        if self.size - candidate.min(self.size) < rounded {
            return Err(WindowError::Full(len));
        }
        self.placed.insert(candidate, (rounded, tag));
        Ok(candidate)
    }

    /// The tag of the placement at `offset`.
    pub fn tag_mut(&mut self, offset: u64) -> Result<&mut T, WindowError> {
        self.placed.get_mut(&offset).map(|(_, tag)| tag).ok_or(WindowError::NotPlaced(offset))
    }

    /// Removes the placement at `offset`, giving back its length and tag.
    pub fn remove(&mut self, offset: u64) -> Result<(u64, T), WindowError> {
        self.placed.remove(&offset).ok_or(WindowError::NotPlaced(offset))
    }

    /// Every placement, lowest first.
    pub fn placements(&self) -> impl Iterator<Item = (u64, u64, &T)> {
        self.placed.iter().map(|(&offset, (len, tag))| (offset, *len, tag))
    }
}
