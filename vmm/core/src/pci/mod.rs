//! A minimal PCI bus for XEMEM in Linux guests with no guest kernel module (docs/xemem-pci.md).
//!
//! Bus 0 holds two functions: a host bridge at 00:00.0 and the XEMEM device at 00:01.0. The
//! guest reaches configuration space through the legacy mechanism (address at port 0xCF8, data at
//! 0xCFC..0xCFF). The XEMEM device has a small 32-bit register BAR (BAR0, the mailbox) and a
//! large 64-bit prefetchable BAR (BAR2, the window) in which the host places attached segments
//! as guest memory, one KVM memory slot per attachment (`window`). Placing a segment locks the
//! window BAR: a guest that moves it or turns memory decoding off while attachments exist is
//! refused (the write is ignored and logged), so memory slots never point at a stale address.
//!
//! Hand-written rather than taken from a crate: the rust-vmm `vm-device`/`pci` crates bring a
//! whole device manager and MSI machinery, while this device needs only a type-0 header with
//! BAR sizing (`config`) and the two legacy ports.

pub mod config;
pub mod link;
pub mod mailbox;
pub mod touch;
pub mod window;

#[cfg(test)]
mod mailbox_tests;
#[cfg(test)]
mod tests;

use config::{ConfigError, Function};
use window::{Window, WindowError};

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};

/// The legacy configuration mechanism's ports: address (0xCF8) and data (0xCFC..0xCFF).
pub const CONFIG_PORTS: HookKey = HookKey::Port { base: 0xcf8, len: 8 };
/// Vendor id of clowder's virtual devices (`xemem::pci`, which libxpmem's guest backend
/// looks for).
pub const VENDOR: u16 = xemem::pci::VENDOR;
/// The host bridge's device id.
pub const HOST_BRIDGE: u16 = 0x0000;
/// The XEMEM device's id.
pub const XEMEM_DEVICE: u16 = xemem::pci::DEVICE;
/// Device number of the XEMEM function on bus 0.
pub const XEMEM_SLOT: u8 = 1;
/// The mailbox BAR's index and size.
pub const MAILBOX_BAR: usize = 0;
pub const MAILBOX_SIZE: u64 = xemem::pci::MAILBOX_SIZE;
/// The window BAR's index and default size.
pub const WINDOW_BAR: usize = 2;
pub const WINDOW_SIZE: u64 = 64 << 30;

/// Where the VMM puts the BARs before the guest looks: the mailbox in the MMIO hole below
/// 4 GiB, the window at 32 TiB, far above RAM and the regions the VMM places by itself.
pub const MAILBOX_BASE: u32 = 0xe000_0000;
pub const WINDOW_BASE: u64 = 1 << 45;

/// The devices to give a VM (`Vm::with_devices`) for XEMEM with `host` behind the mailbox:
/// the configuration ports and the mailbox aperture, and the window's holes. Touches of revoked
/// placements go to the host's reporter from a thread of their own (never from a vCPU, which
/// would wait for the daemon), started here when the host has one.
pub fn xemem_devices(host: Box<dyn mailbox::MailboxHost>) -> std::io::Result<Vec<crate::ExtraDevice>> {
    let bus = PciBus::new(MAILBOX_BASE, WINDOW_BASE, WINDOW_SIZE);
    let device = mailbox::XememPci::new(bus, u64::from(MAILBOX_BASE), host);
    let touches = device.touches();
    if let Some(mut reporter) = device.reporter() {
        let queued = touches.clone();
        std::thread::Builder::new().name("xemem-touches".into()).spawn(move || loop {
            for touch in queued.wait() {
                reporter.touched(touch);
            }
        })?;
    }
    Ok(vec![
        crate::ExtraDevice {
            name: "xemem-pci".into(),
            keys: vec![CONFIG_PORTS, HookKey::Mmio { base: u64::from(MAILBOX_BASE), len: MAILBOX_SIZE }],
            device: std::sync::Arc::new(std::sync::Mutex::new(device)),
        },
        crate::ExtraDevice {
            name: "xemem-window".into(),
            keys: vec![HookKey::Mmio { base: WINDOW_BASE, len: WINDOW_SIZE }],
            device: std::sync::Arc::new(std::sync::Mutex::new(mailbox::WindowHoles::new(WINDOW_BASE, touches))),
        },
    ])
}

/// Class codes: host bridge (06/00) and "other memory controller" (05/80).
const CLASS_HOST_BRIDGE: u32 = 0x06_00_00;
const CLASS_MEMORY_OTHER: u32 = 0x05_80_00;
/// CONFIG_ADDRESS's enable bit.
const ENABLE: u32 = 1 << 31;

/// The bus: configuration space of both functions, and the XEMEM device's window.
pub struct PciBus {
    address: u32,
    bridge: Function,
    xemem: Function,
    /// Placements, each tagged with the KVM memory slot the caller made for it.
    window: Window<u32>,
    /// Configuration writes refused so far (a guest reprogramming a locked BAR).
    pub refused: u64,
}

impl PciBus {
    /// The bus with the BARs at `mailbox_base` and `window_base` (where firmware would have put
    /// them; the guest may move them while nothing is placed) and memory decoding on.
    pub fn new(mailbox_base: u32, window_base: u64, window_size: u64) -> PciBus {
        let bridge = Function::new(VENDOR, HOST_BRIDGE, CLASS_HOST_BRIDGE);
        let mut xemem = Function::new(VENDOR, XEMEM_DEVICE, CLASS_MEMORY_OTHER);
        xemem.bars[MAILBOX_BAR] = Some(config::Bar { size: MAILBOX_SIZE, wide: false, base: u64::from(mailbox_base) });
        xemem.bars[WINDOW_BAR] = Some(config::Bar { size: window_size, wide: true, base: window_base });
        xemem.locked_bar = Some(WINDOW_BAR);
        xemem.command = config::COMMAND_MEMORY;
        PciBus { address: 0, bridge, xemem, window: Window::new(window_size), refused: 0 }
    }

    /// The function `CONFIG_ADDRESS` selects, with the register offset, if it exists.
    fn selected(&mut self) -> Option<(&mut Function, u8)> {
        if self.address & ENABLE == 0 {
            return None;
        }
        let (bus, slot, function) = ((self.address >> 16) & 0xff, (self.address >> 11) & 0x1f, (self.address >> 8) & 7);
        let register = (self.address & 0xfc) as u8;
        match (bus, slot, function) {
            (0, 0, 0) => Some((&mut self.bridge, register)),
            (0, s, 0) if s == u32::from(XEMEM_SLOT) => Some((&mut self.xemem, register)),
            _ => None,
        }
    }

    /// A port read at `offset` from 0xCF8. Anything not a whole, aligned register reads as all
    /// ones, as do absent functions.
    pub fn port_read(&mut self, offset: u16, data: &mut [u8]) {
        let value = match (offset, data.len()) {
            (0, 4) => Some(self.address),
            (4..=7, len @ (1 | 2 | 4)) if usize::from(offset - 4) % len == 0 => {
                self.selected().map(|(function, register)| function.read_dword(register) >> (8 * (offset - 4)))
            }
            _ => None,
        };
        let bytes = value.unwrap_or(u32::MAX).to_le_bytes();
        let len = data.len().min(4);
        data[..len].copy_from_slice(&bytes[..len]);
        data[len..].fill(0xff);
    }

    /// A port write at `offset` from 0xCF8; misaligned or odd-sized ones are ignored.
    pub fn port_write(&mut self, offset: u16, data: &[u8]) -> Result<(), ConfigError> {
        let mut bytes = [0u8; 4];
        let len = data.len();
        match (offset, len) {
            (0, 4) => {
                bytes.copy_from_slice(data);
                self.address = u32::from_le_bytes(bytes);
            }
            (4..=7, 1 | 2 | 4) if usize::from(offset - 4) % len == 0 => {
                let shift = 8 * u32::from(offset - 4);
                bytes[..len].copy_from_slice(data);
                let value = u32::from_le_bytes(bytes) << shift;
                let mask = (u32::MAX >> (32 - 8 * len as u32)) << shift;
                let locked = !self.window.is_empty();
                if let Some((function, register)) = self.selected() {
                    function.locked = locked;
                    return function.write_dword(register, value, mask);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The window BAR's guest-physical base, if the guest decodes it.
    pub fn window_base(&self) -> Option<u64> {
        self.xemem.decoded_base(WINDOW_BAR)
    }

    /// The mailbox BAR's guest-physical base, if the guest decodes it.
    pub fn mailbox_base(&self) -> Option<u64> {
        self.xemem.decoded_base(MAILBOX_BAR)
    }

    /// Reserves `len` bytes of the window for one attachment: its offset in the window and its
    /// guest-physical address. The caller then adds one memory slot there and tags it with
    /// `set_slot`. Refused while the guest has memory decoding off.
    pub fn place(&mut self, len: u64) -> Result<(u64, u64), PlaceError> {
        let base = self.window_base().ok_or(PlaceError::NotDecoding)?;
        let offset = self.window.place(len, u32::MAX).map_err(PlaceError::Window)?;
        Ok((offset, base + offset))
    }

    /// Records the memory slot backing the placement at `offset`.
    pub fn set_slot(&mut self, offset: u64, slot: u32) -> Result<(), PlaceError> {
        *self.window.tag_mut(offset).map_err(PlaceError::Window)? = slot;
        Ok(())
    }

    /// The tag `set_slot` gave the placement at `offset`.
    pub fn token(&mut self, offset: u64) -> Result<u32, PlaceError> {
        self.window.tag_mut(offset).map(|tag| *tag).map_err(PlaceError::Window)
    }

    /// Ends the placement at `offset`: the memory slot the caller must remove.
    pub fn unplace(&mut self, offset: u64) -> Result<u32, PlaceError> {
        self.window.remove(offset).map(|(_, slot)| slot).map_err(PlaceError::Window)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// The guest turned memory decoding off: there is no address to place at.
    NotDecoding,
    Window(WindowError),
}

impl std::fmt::Display for PlaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlaceError::NotDecoding => f.write_str("the guest has the XEMEM window BAR's memory decoding off"),
            PlaceError::Window(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PlaceError {}

impl Device for PciBus {
    fn handle(&mut self, ctx: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::PortRead { offset, data } => self.port_read(offset, data),
            Request::PortWrite { offset, data } => {
                if let Err(e) = self.port_write(offset, data) {
                    // The guest keeps running; its write simply did not happen.
                    self.refused += 1;
                    log::warn!("vCPU {}: PCI configuration write refused: {e}", ctx.vcpu);
                }
            }
            other => return Err(DeviceError(format!("the PCI configuration ports cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}
