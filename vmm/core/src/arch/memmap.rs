//! The guest's RAM layout and the memory map handed to it (PVH memmap and Linux e820 alike).

use super::layout::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    Ram = 1,
    Reserved = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryMapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: MemoryKind,
}

/// One contiguous piece of guest RAM and where it lives in the VM's memfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRange {
    pub gpa: u64,
    pub size: u64,
    pub file_offset: u64,
}

/// How a VM's RAM is laid out in guest-physical space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestLayout {
    /// RAM below the MMIO hole, from 0.
    pub low: RamRange,
    /// RAM from 4 GiB up, if the VM has more than `LOW_RAM_MAX`.
    pub high: Option<RamRange>,
    /// The enclave channel: reserved RAM at the top of low RAM.
    pub channel: Option<RamRange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    TooSmall { size: u64, min: u64 },
    Unaligned { size: u64 },
    ChannelTooLarge { channel: u64, low_ram: u64 },
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::TooSmall { size, min } => {
                write!(f, "{size} bytes of RAM is too small (at least {min})")
            }
            LayoutError::Unaligned { size } => write!(f, "{size} bytes is not a multiple of 4 KiB"),
            LayoutError::ChannelTooLarge { channel, low_ram } => {
                write!(f, "a {channel}-byte channel does not fit in {low_ram} bytes of low RAM with the kernel")
            }
        }
    }
}

impl GuestLayout {
    pub fn new(ram_size: u64, channel_size: u64) -> Result<Self, LayoutError> {
        if ram_size < MIN_RAM {
            return Err(LayoutError::TooSmall { size: ram_size, min: MIN_RAM });
        }
        if ram_size % PAGE_SIZE != 0 || channel_size % PAGE_SIZE != 0 {
            return Err(LayoutError::Unaligned { size: ram_size.max(channel_size) });
        }
        let low_size = ram_size.min(LOW_RAM_MAX);
        let low = RamRange { gpa: 0, size: low_size, file_offset: 0 };
        let high =
            (ram_size > LOW_RAM_MAX).then(|| RamRange { gpa: MMIO_HOLE_END, size: ram_size - LOW_RAM_MAX, file_offset: LOW_RAM_MAX });
        let channel = if channel_size == 0 {
            None
        } else {
            // The kernel is loaded at 1 MiB: keep at least 1 MiB above it for the kernel itself.
            if channel_size + 2 * HIGH_MEMORY_START > low_size {
                return Err(LayoutError::ChannelTooLarge { channel: channel_size, low_ram: low_size });
            }
            let gpa = low_size - channel_size;
            Some(RamRange { gpa, size: channel_size, file_offset: gpa })
        };
        Ok(GuestLayout { low, high, channel })
    }

    /// Bytes of RAM in the VM (the memfd's size).
    pub fn ram_size(&self) -> u64 {
        self.low.size + self.high.map_or(0, |h| h.size)
    }

    /// End of low RAM usable for kernels and modules (below the channel).
    pub fn low_usable_end(&self) -> u64 {
        self.channel.map_or(self.low.size, |c| c.gpa)
    }

    /// First guest-physical address above all RAM: where run-time regions may go.
    pub fn ram_end(&self) -> u64 {
        self.high.map_or(self.low.size, |h| h.gpa + h.size)
    }

    /// RAM ranges, in guest-physical order.
    pub fn ram_ranges(&self) -> impl Iterator<Item = RamRange> + '_ {
        std::iter::once(self.low).chain(self.high)
    }

    /// The memory map the guest sees, sorted and without overlaps.
    pub fn memory_map(&self) -> Vec<MemoryMapEntry> {
        let mut map = vec![
            MemoryMapEntry { addr: 0, size: EBDA_START, kind: MemoryKind::Ram },
            MemoryMapEntry { addr: EBDA_START, size: HIGH_MEMORY_START - EBDA_START, kind: MemoryKind::Reserved },
            MemoryMapEntry { addr: HIGH_MEMORY_START, size: self.low_usable_end() - HIGH_MEMORY_START, kind: MemoryKind::Ram },
        ];
        if let Some(c) = self.channel {
            map.push(MemoryMapEntry { addr: c.gpa, size: c.size, kind: MemoryKind::Reserved });
        }
        if let Some(h) = self.high {
            map.push(MemoryMapEntry { addr: h.gpa, size: h.size, kind: MemoryKind::Ram });
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_vm_has_ram_hole_ram_channel() {
        let l = GuestLayout::new(64 * MIB, 64 * 1024).unwrap();
        let map = l.memory_map();
        assert_eq!(map.len(), 4);
        assert_eq!(map[0], MemoryMapEntry { addr: 0, size: 0x9fc00, kind: MemoryKind::Ram });
        assert_eq!(map[1].kind, MemoryKind::Reserved);
        assert_eq!(map[2].addr, MIB);
        assert_eq!(map[2].addr + map[2].size, 64 * MIB - 64 * 1024);
        assert_eq!(map[3], MemoryMapEntry { addr: 64 * MIB - 65536, size: 65536, kind: MemoryKind::Reserved });
        assert!(l.high.is_none());
        assert_eq!(l.ram_end(), 64 * MIB);
    }

    #[test]
    fn large_vm_continues_above_4g() {
        let l = GuestLayout::new(5 * GIB, 0).unwrap();
        assert_eq!(l.low.size, 3 * GIB);
        assert_eq!(l.high, Some(RamRange { gpa: 4 * GIB, size: 2 * GIB, file_offset: 3 * GIB }));
        assert_eq!(l.ram_size(), 5 * GIB);
        assert_eq!(l.ram_end(), 6 * GIB);
        let map = l.memory_map();
        assert_eq!(map.last().unwrap().addr, 4 * GIB);
        for pair in map.windows(2) {
            assert!(pair[0].addr + pair[0].size <= pair[1].addr, "sorted, disjoint: {map:?}");
        }
    }

    #[test]
    fn rejects_tiny_unaligned_and_oversized_channel() {
        assert!(matches!(GuestLayout::new(MIB, 0), Err(LayoutError::TooSmall { .. })));
        assert!(matches!(GuestLayout::new(4 * MIB + 1, 0), Err(LayoutError::Unaligned { .. })));
        assert!(matches!(GuestLayout::new(4 * MIB, 3 * MIB), Err(LayoutError::ChannelTooLarge { .. })));
    }
}
