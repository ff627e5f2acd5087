//! One PCI function's type-0 configuration header: identity registers, the command register,
//! base address registers (sized by writing all ones, as every OS does) and the interrupt line.
//! Everything else reads as zero and ignores writes. Pure logic: no KVM, unit-tested.

/// The command register's bits a guest may set: I/O space, memory space, bus master.
const COMMAND_WRITABLE: u16 = 0b111;
/// Memory space decoding: a memory BAR is reachable only while this is set.
pub const COMMAND_MEMORY: u16 = 0b10;
/// A 64-bit prefetchable memory BAR's flag bits (type 10b, prefetchable).
const BAR_64_PREFETCH: u32 = 0b1100;

/// A memory base address register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    /// A power of two, at least 16 bytes.
    pub size: u64,
    /// Two registers (64-bit, prefetchable) or one (32-bit, not prefetchable).
    pub wide: bool,
    /// Where the guest placed it.
    pub base: u64,
}

impl Bar {
    fn flags(&self) -> u32 {
        if self.wide {
            BAR_64_PREFETCH
        } else {
            0
        }
    }
}

/// Why a configuration write was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The BAR (or memory decoding) cannot change while segments are placed in it.
    Locked(&'static str),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Locked(what) => write!(f, "{what} cannot change while attachments are placed in the BAR window"),
        }
    }
}

/// A function's configuration space (the 256-byte conventional header).
#[derive(Debug, Clone)]
pub struct Function {
    pub vendor: u16,
    pub device: u16,
    /// Class, subclass and programming interface, in the register's order (class in bits 23:16).
    pub class: u32,
    pub revision: u8,
    pub command: u16,
    pub interrupt_line: u8,
    /// BAR slots 0..6; a 64-bit BAR in slot i takes slot i+1 too (left `None`).
    pub bars: [Option<Bar>; 6],
    /// The BAR index whose base must not move (and the memory decoding that must stay on)
    /// while `locked`.
    pub locked_bar: Option<usize>,
    pub locked: bool,
}

impl Function {
    pub fn new(vendor: u16, device: u16, class: u32) -> Function {
        Function { vendor, device, class, revision: 1, command: 0, interrupt_line: 0xff, bars: [None; 6], locked_bar: None, locked: false }
    }

    /// The base of BAR `index` if memory decoding is on, else `None`.
    pub fn decoded_base(&self, index: usize) -> Option<u64> {
        let bar = self.bars.get(index).copied().flatten()?;
        (self.command & COMMAND_MEMORY != 0).then_some(bar.base)
    }

    /// The dword at register `offset` (a multiple of 4 below 256).
    pub fn read_dword(&self, offset: u8) -> u32 {
        match offset {
            0x00 => u32::from(self.device) << 16 | u32::from(self.vendor),
            0x04 => u32::from(self.command),
            0x08 => self.class << 8 | u32::from(self.revision),
            0x10..=0x24 => self.read_bar(usize::from((offset - 0x10) / 4)),
            0x2c => u32::from(self.device) << 16 | u32::from(self.vendor),
            // Interrupt pin 0: the device raises no legacy interrupt.
            0x3c => u32::from(self.interrupt_line),
            _ => 0,
        }
    }

    fn read_bar(&self, slot: usize) -> u32 {
        if let Some(bar) = self.bars[slot] {
            return (bar.base & !(bar.size - 1)) as u32 & !0xf | bar.flags();
        }
        match slot.checked_sub(1).and_then(|lower| self.bars[lower]) {
            Some(bar) if bar.wide => ((bar.base & !(bar.size - 1)) >> 32) as u32,
            _ => 0,
        }
    }

    /// Writes `value` under `mask` (the bytes the access covers) to the dword at `offset`.
    pub fn write_dword(&mut self, offset: u8, value: u32, mask: u32) -> Result<(), ConfigError> {
        let merged = (self.read_dword(offset) & !mask) | (value & mask);
        match offset {
            0x04 => {
                let command = merged as u16 & COMMAND_WRITABLE;
                if self.locked && command & COMMAND_MEMORY == 0 && self.command & COMMAND_MEMORY != 0 {
                    return Err(ConfigError::Locked("memory decoding"));
                }
                self.command = command;
            }
            0x10..=0x24 => self.write_bar(usize::from((offset - 0x10) / 4), merged)?,
            0x3c => self.interrupt_line = merged as u8,
            _ => {}
        }
        Ok(())
    }

    fn write_bar(&mut self, slot: usize, value: u32) -> Result<(), ConfigError> {
        let (index, high) = match (self.bars[slot], slot.checked_sub(1).and_then(|lower| self.bars[lower])) {
            (Some(_), _) => (slot, false),
            (None, Some(lower)) if lower.wide => (slot - 1, true),
            _ => return Ok(()),
        };
        let bar = self.bars[index].as_mut().expect("slot checked above");
        let mask = !(bar.size - 1);
        let base =
            if high { (bar.base & 0xffff_ffff) | (u64::from(value) << 32) } else { (bar.base & !0xffff_ffff) | u64::from(value & !0xf) }
                & mask;
        if base == bar.base {
            return Ok(());
        }
        if self.locked && self.locked_bar == Some(index) {
            return Err(ConfigError::Locked("the window BAR"));
        }
        bar.base = base;
        Ok(())
    }
}
