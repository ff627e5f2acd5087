//! The XEMEM device's mailbox BAR (docs/xemem-pci.md): the guest fills a request in, rings the
//! doorbell, and the host's answer is in place before the vCPU resumes. Everything the guest
//! wrote is checked here (sizes, alignment, names) before the host sees it; the host
//! (`MailboxHost`, the daemon's XEMEM routing) checks the rest (frames inside guest RAM,
//! permits). ATTACH and DETACH are carried out here: a placement in the window and one memory
//! slot made by the host.
//!
//! A detached placement the host keeps (its memory stays at the place while the guest holds
//! the permit) is parked: the place stays reserved, and the permit's next attach of the same
//! range is placed there again. On a PVM host removing a memory slot drops the whole machine's
//! shadow page tables, and every 4 KiB page of a new slot is a host fault on first touch, so a
//! guest that attaches the same data at every step would otherwise pay both each time. The
//! place is given back at the permit's release, at an attach of another range through it, or
//! when the host kept nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use xemem::pci;

use super::touch::{Touch, Touches};
use super::{PciBus, MAILBOX_SIZE};
use crate::hooks::{Device, DeviceError, ExitContext, Outcome, Request};

pub use xemem::pci::{MAGIC, VERSION};
// The fields' offsets are `xemem::pci`'s (shared with libxpmem's C backend), as indices here.
const DOORBELL: usize = pci::DOORBELL as usize;
const DONE: usize = pci::DONE as usize;
const OP: usize = pci::OP as usize;
const ERROR: usize = pci::ERROR as usize;
const NRUNS: usize = pci::NRUNS as usize;
const ARGS: usize = pci::ARGS as usize;
const RESULTS: usize = pci::RESULTS as usize;
const NAME: usize = pci::NAME as usize;
const NAME_LEN: usize = pci::NAME_LEN as usize;
const RUNS: usize = pci::RUNS as usize;
const RUN_SIZE: usize = pci::RUN_SIZE as usize;
/// Runs one RUNS request carries at most.
pub const MAX_RUNS: usize = (MAILBOX_SIZE as usize - RUNS) / RUN_SIZE;
const PAGE: u64 = 4096;

/// The ranges a guest may write; the rest (magic, version, done, error, results) is the host's.
const GUEST_WRITABLE: [(usize, usize); 5] =
    [(DOORBELL, DOORBELL + 4), (OP, OP + 4), (NRUNS, NRUNS + 4), (ARGS, RESULTS), (NAME, MAILBOX_SIZE as usize)];

const EINVAL: i32 = libc::EINVAL;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    Hello = pci::OP_HELLO,
    Runs = pci::OP_RUNS,
    Make = pci::OP_MAKE,
    Remove = pci::OP_REMOVE,
    Get = pci::OP_GET,
    Release = pci::OP_RELEASE,
    Attach = pci::OP_ATTACH,
    Detach = pci::OP_DETACH,
    Lookup = pci::OP_LOOKUP,
    Signal = pci::OP_SIGNAL,
}

impl Op {
    pub fn from_u32(op: u32) -> Option<Op> {
        const OPS: [Op; 10] =
            [Op::Hello, Op::Runs, Op::Make, Op::Remove, Op::Get, Op::Release, Op::Attach, Op::Detach, Op::Lookup, Op::Signal];
        OPS.into_iter().find(|known| *known as u32 == op)
    }
}

/// One checked request, as the host sees it.
#[derive(Debug, PartialEq, Eq)]
pub struct MailboxRequest {
    pub op: Op,
    pub args: [u64; 6],
    /// MAKE (optional) and LOOKUP (required): 1..63 printable characters, no spaces.
    pub name: Option<String>,
    /// RUNS: guest-physical (address, length), page-aligned and non-empty.
    pub runs: Vec<(u64, u64)>,
}

/// The host side: the daemon's XEMEM routing for this VM.
pub trait MailboxHost: Send {
    /// Every op but ATTACH and DETACH: up to four results, or an errno value.
    fn call(&mut self, request: &MailboxRequest) -> Result<[u64; 4], i32>;
    /// Backs `len` bytes at guest-physical `gpa` with segment memory of permit `apid` from
    /// `offset`, as one memory slot: the slot's id, or an errno value.
    fn place(&mut self, apid: u64, offset: u64, len: u64, gpa: u64) -> Result<u32, i32>;
    /// Detaches the attachment `place` answered with `token`: whether the host keeps its
    /// memory at the place for the permit's next attach of the same range (until the permit's
    /// release, or an attach of another range through it).
    fn unplace(&mut self, token: u32) -> bool;
    /// Where touches of revoked placements are reported, from a thread of their own
    /// (`super::touch`); `None`: nowhere (they read all ones, nothing more).
    fn reporter(&self) -> Option<Box<dyn TouchReporter>> {
        None
    }
}

/// Reports a guest's user-mode touch of a revoked placement (the daemon tells the guest agent,
/// which sends SIGBUS to the placement's attachers).
pub trait TouchReporter: Send {
    fn touched(&mut self, touch: Touch);
}

/// An attachment's permit and range, as its placement is parked under and found again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Attached {
    apid: u64,
    offset: u64,
    len: u64,
}

/// The XEMEM device: configuration space, the mailbox registers and the host behind them.
/// Hooked on `super::CONFIG_PORTS` and on an MMIO aperture that holds the mailbox BAR.
pub struct XememPci {
    pub bus: PciBus,
    registers: Vec<u8>,
    host: Box<dyn MailboxHost>,
    /// Where the hooked MMIO range starts (MMIO offsets are relative to it).
    aperture: u64,
    /// Attached placements by window offset.
    attached: HashMap<u64, Attached>,
    /// Detached placements whose memory the host keeps: window offset by permit (one each, as
    /// the host keeps one attachment per permit).
    parked: HashMap<u64, (Attached, u64)>,
    /// The attached placements' addresses, for `WindowHoles` to tell touches after a
    /// revocation from other hole accesses.
    touches: Arc<Touches>,
}

impl XememPci {
    pub fn new(bus: PciBus, aperture: u64, host: Box<dyn MailboxHost>) -> XememPci {
        let mut registers = vec![0; MAILBOX_SIZE as usize];
        let (magic, version) = (pci::MAGIC_AT as usize, pci::VERSION_AT as usize);
        registers[magic..magic + 4].copy_from_slice(&MAGIC.to_le_bytes());
        registers[version..version + 4].copy_from_slice(&VERSION.to_le_bytes());
        let touches = Arc::new(Touches::default());
        XememPci { bus, registers, host, aperture, attached: HashMap::new(), parked: HashMap::new(), touches }
    }

    /// The attached placements, as `WindowHoles` needs them.
    pub fn touches(&self) -> Arc<Touches> {
        self.touches.clone()
    }

    /// Where the host reports touches of revoked placements, if anywhere.
    pub fn reporter(&self) -> Option<Box<dyn TouchReporter>> {
        self.host.reporter()
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.registers[at..at + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.registers[at..at + 8].try_into().expect("8 bytes"))
    }

    /// The mailbox offset of an access at `address`, if it is a naturally aligned 1/2/4/8-byte
    /// access inside the mailbox BAR as the guest decodes it now.
    fn mailbox_offset(&self, address: u64, len: usize) -> Option<usize> {
        let offset = address.checked_sub(self.bus.mailbox_base()?)?;
        let fits = matches!(len, 1 | 2 | 4 | 8) && offset % len as u64 == 0 && offset + len as u64 <= MAILBOX_SIZE;
        fits.then_some(offset as usize)
    }

    /// An MMIO read at `address` (guest-physical); anything outside the mailbox reads all ones.
    pub fn mmio_read(&self, address: u64, data: &mut [u8]) {
        match self.mailbox_offset(address, data.len()) {
            Some(offset) => data.copy_from_slice(&self.registers[offset..offset + data.len()]),
            None => data.fill(0xff),
        }
    }

    /// An MMIO write at `address`; writes to the host's fields or outside the mailbox are
    /// ignored. A write to the doorbell runs the request.
    pub fn mmio_write(&mut self, address: u64, data: &[u8]) {
        let Some(offset) = self.mailbox_offset(address, data.len()) else { return };
        let end = offset + data.len();
        if !GUEST_WRITABLE.iter().any(|&(lo, hi)| offset >= lo && end <= hi) {
            return;
        }
        self.registers[offset..end].copy_from_slice(data);
        if offset == DOORBELL && data.len() == 4 {
            let answer = self.run();
            let (error, results) = match answer {
                Ok(results) => (0, results),
                Err(errno) => (errno, [0; 4]),
            };
            self.registers[ERROR..ERROR + 4].copy_from_slice(&error.to_le_bytes());
            for (i, value) in results.iter().enumerate() {
                self.registers[RESULTS + 8 * i..RESULTS + 8 * i + 8].copy_from_slice(&value.to_le_bytes());
            }
            self.registers.copy_within(DOORBELL..DOORBELL + 4, DONE);
        }
    }

    /// The request in the registers, checked.
    fn request(&self) -> Result<MailboxRequest, i32> {
        let op = Op::from_u32(self.u32_at(OP)).ok_or(libc::ENOSYS)?;
        let args = std::array::from_fn(|i| self.u64_at(ARGS + 8 * i));
        let name = match op {
            Op::Make | Op::Lookup => {
                let raw = &self.registers[NAME..NAME + NAME_LEN];
                let len = raw.iter().position(|&b| b == 0).ok_or(EINVAL)?;
                let valid = raw[..len].iter().all(|b| b.is_ascii_graphic());
                match (len, op) {
                    (0, Op::Make) => None,
                    (1..=63, _) if valid => Some(String::from_utf8_lossy(&raw[..len]).into_owned()),
                    _ => return Err(EINVAL),
                }
            }
            _ => None,
        };
        let mut runs = Vec::new();
        if op == Op::Runs {
            let count = self.u32_at(NRUNS) as usize;
            if count == 0 || count > MAX_RUNS {
                return Err(EINVAL);
            }
            for i in 0..count {
                let (gpa, len) = (self.u64_at(RUNS + RUN_SIZE * i), self.u64_at(RUNS + RUN_SIZE * i + 8));
                if len == 0 || gpa % PAGE != 0 || len % PAGE != 0 || gpa.checked_add(len).is_none() {
                    return Err(EINVAL);
                }
                runs.push((gpa, len));
            }
        }
        Ok(MailboxRequest { op, args, name, runs })
    }

    fn run(&mut self) -> Result<[u64; 4], i32> {
        let request = self.request()?;
        match request.op {
            Op::Attach => {
                let [apid, offset, len, ..] = request.args;
                if len == 0 || len % PAGE != 0 || offset % PAGE != 0 {
                    return Err(EINVAL);
                }
                self.attach(Attached { apid, offset, len })
            }
            Op::Detach => {
                let window_offset = request.args[0];
                let attached = self.attached.remove(&window_offset).ok_or(EINVAL)?;
                let token = self.bus.token(window_offset).map_err(|_| EINVAL)?;
                // The window cannot move while anything is placed: the address is the attach's.
                if let Some(base) = self.bus.window_base() {
                    self.touches.detached(base + window_offset);
                }
                if self.host.unplace(token) {
                    if let Some((_, stale)) = self.parked.insert(attached.apid, (attached, window_offset)) {
                        let _ = self.bus.unplace(stale);
                    }
                } else {
                    let _ = self.bus.unplace(window_offset);
                }
                Ok([0; 4])
            }
            Op::Release => {
                let released = self.host.call(&request);
                // The host dropped what it kept for the permit, unless it never heard the call.
                if !matches!(released, Err(libc::ETIMEDOUT)) {
                    if let Some((_, window_offset)) = self.parked.remove(&request.args[0]) {
                        let _ = self.bus.unplace(window_offset);
                    }
                }
                released
            }
            _ => self.host.call(&request),
        }
    }

    /// ATTACH: at the permit's parked place when it kept this range, else at a new one. The
    /// host drops what it kept of another range through the permit during the attach, so that
    /// place is given back after it (not before: the new place must not overlap it).
    fn attach(&mut self, attached: Attached) -> Result<[u64; 4], i32> {
        let parked = self.parked.remove(&attached.apid);
        let (window_offset, stale) = match parked {
            Some((kept, window_offset)) if kept == attached => (window_offset, None),
            other => (self.bus.place(attached.len).map_err(|_| libc::ENOSPC)?.0, other.map(|(_, at)| at)),
        };
        let gpa = self.bus.window_base().ok_or(libc::ENOSPC)? + window_offset;
        let placed = self.host.place(attached.apid, attached.offset, attached.len, gpa);
        if let Some(stale) = stale {
            let _ = self.bus.unplace(stale);
        }
        match placed {
            Ok(token) => {
                self.bus.set_slot(window_offset, token).map_err(|_| libc::EIO)?;
                self.attached.insert(window_offset, attached);
                self.touches.attached(gpa, attached.len, Touch { token, window_offset });
                Ok([window_offset, attached.len, 0, 0])
            }
            // A failed attach leaves nothing kept.
            Err(errno) => {
                let _ = self.bus.unplace(window_offset);
                Err(errno)
            }
        }
    }
}

impl Device for XememPci {
    fn handle(&mut self, ctx: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::MmioRead { offset, data } => self.mmio_read(self.aperture + offset, data),
            Request::MmioWrite { offset, data } => self.mmio_write(self.aperture + offset, data),
            ports @ (Request::PortRead { .. } | Request::PortWrite { .. }) => return self.bus.handle(ctx, ports),
            other => return Err(DeviceError(format!("the XEMEM PCI device cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}

/// The window's parts with no memory slot (never placed, detached, or revoked by the host):
/// hooked on the window's range so a guest touching them reads all ones and writes nothing, as
/// a PCI master abort does, instead of an unclaimed MMIO exit stopping the whole VM. A
/// user-mode touch of a placement still attached (its segment was revoked) is queued for a
/// report (`super::touch`), which ends in SIGBUS for its attachers.
#[derive(Default)]
pub struct WindowHoles {
    /// Where the hooked range starts (MMIO offsets are relative to it).
    base: u64,
    touches: Arc<Touches>,
    /// Accesses so far (a guest program using an attachment after its revocation).
    pub accesses: u64,
    /// Touches queued for a report.
    pub reported: u64,
}

impl WindowHoles {
    /// Holes of the window hooked at `base`, whose placements `touches` has.
    pub fn new(base: u64, touches: Arc<Touches>) -> WindowHoles {
        WindowHoles { base, touches, accesses: 0, reported: 0 }
    }
}

impl Device for WindowHoles {
    fn handle(&mut self, ctx: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        let offset = match request {
            Request::MmioRead { offset, data } => {
                data.fill(0xff);
                offset
            }
            Request::MmioWrite { offset, .. } => offset,
            other => return Err(DeviceError(format!("the XEMEM window cannot handle {other:?}"))),
        };
        self.accesses += 1;
        if self.touches.touched(self.base + offset, || ctx.cpl(), Instant::now()) {
            self.reported += 1;
        }
        Ok(Outcome::Continue)
    }
}
