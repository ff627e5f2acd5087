//! One registry for every kind of exit a device can claim: port-I/O ranges, MMIO ranges, MSRs and
//! hypercall numbers. Devices register keys by name from the configuration; the vCPU loop looks
//! each exit up here and hands it to the owner as a `Request`. An exit nobody claimed is reported
//! to the caller, never silently ignored.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::stop::StopReason;

/// What a device can claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKey {
    Port { base: u16, len: u16 },
    Mmio { base: u64, len: u64 },
    Msr(u32),
    Hypercall(u32),
}

impl fmt::Display for HookKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookKey::Port { base, len } => write!(f, "port {base:#x}+{len}"),
            HookKey::Mmio { base, len } => write!(f, "mmio {base:#x}+{len:#x}"),
            HookKey::Msr(i) => write!(f, "msr {i:#x}"),
            HookKey::Hypercall(nr) => write!(f, "hypercall {nr}"),
        }
    }
}

/// One guest access, as the owning device sees it. Offsets are relative to the hooked range.
#[derive(Debug)]
pub enum Request<'a> {
    PortRead { offset: u16, data: &'a mut [u8] },
    PortWrite { offset: u16, data: &'a [u8] },
    MmioRead { offset: u64, data: &'a mut [u8] },
    MmioWrite { offset: u64, data: &'a [u8] },
    MsrRead { index: u32, value: &'a mut u64 },
    MsrWrite { index: u32, value: u64 },
    Hypercall { nr: u32, args: [u64; 4], result: &'a mut i64 },
}

/// Who is asking: the vCPU whose exit this is.
#[derive(Debug, Clone, Copy)]
pub struct ExitContext {
    pub vcpu: usize,
    /// The vCPU's KVM descriptor, for `cpl` (`None` outside a vCPU thread: tests). Raw, with
    /// KVM_GET_SREGS issued by hand below: the exit being handled borrows the `VcpuFd` mutably
    /// (`VcpuExit` holds its run page), so kvm-ioctls' `get_sregs` cannot be called on it.
    pub vcpu_fd: Option<std::os::fd::RawFd>,
}

vmm_sys_util::ioctl_ior_nr!(KVM_GET_SREGS, kvm_bindings::KVMIO, 0x83, kvm_bindings::kvm_sregs);

impl ExitContext {
    /// The vCPU's current privilege level (the RPL of CS, as the instruction profile reads it),
    /// read with KVM_GET_SREGS: about 20 µs on PVM, so asked only when a device needs it.
    pub fn cpl(&self) -> Option<u8> {
        let fd = self.vcpu_fd?;
        let mut sregs = kvm_bindings::kvm_sregs::default();
        // SAFETY: the descriptor is this vCPU's, open for the whole run loop that made this
        // context; KVM_GET_SREGS writes one kvm_sregs, which outlives the call.
        let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(&std::os::fd::BorrowedFd::borrow_raw(fd), KVM_GET_SREGS(), &mut sregs) };
        (rc == 0).then_some((sregs.cs.selector & 3) as u8)
    }

    /// The host core the vCPU thread runs on now (asked only when a device needs it: it is not
    /// free on the exit path).
    pub fn host_core(&self) -> Option<usize> {
        // SAFETY: no arguments; returns -1 on failure.
        let core = unsafe { libc::sched_getcpu() };
        (core >= 0).then_some(core as usize)
    }
}

/// What the vCPU does after a device handled a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Continue,
    Stop(StopReason),
}

/// A guest did something the device cannot accept (nonsense values, wrong width...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError(pub String);

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A device model. `handle` is called from the vCPU thread that took the exit.
pub trait Device: Send {
    fn handle(&mut self, ctx: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError>;
}

pub type DeviceHandle = Arc<Mutex<dyn Device>>;

#[derive(Clone)]
struct Owner {
    name: Arc<str>,
    key: HookKey,
    device: DeviceHandle,
}

/// A registered owner, as found by a lookup.
#[derive(Clone, Copy)]
pub struct Claim<'r> {
    pub name: &'r str,
    pub key: HookKey,
    pub device: &'r DeviceHandle,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConflict {
    pub key: HookKey,
    pub new_owner: String,
    pub existing_owner: String,
}

impl fmt::Display for HookConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {:?} cannot hook {}: already hooked by {:?}", self.new_owner, self.key, self.existing_owner)
    }
}

/// The registry. Ranges are kept sorted by base so lookups are a binary search.
#[derive(Default, Clone)]
pub struct HookRegistry {
    ports: BTreeMap<u16, Owner>,
    mmio: BTreeMap<u64, Owner>,
    msrs: BTreeMap<u32, Owner>,
    hypercalls: BTreeMap<u32, Owner>,
    hypercall_port: Option<u16>,
}

fn range_lookup<K: Ord + Copy>(map: &BTreeMap<K, Owner>, addr: K, end_of: impl Fn(&HookKey) -> bool) -> Option<&Owner> {
    map.range(..=addr).next_back().map(|(_, o)| o).filter(|o| end_of(&o.key))
}

impl HookRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims `key` for `device`. Overlapping claims are refused, naming both devices.
    pub fn hook(&mut self, name: &str, key: HookKey, device: DeviceHandle) -> Result<(), HookConflict> {
        let conflict = |existing: &Owner| HookConflict { key, new_owner: name.to_string(), existing_owner: existing.name.to_string() };
        let owner = Owner { name: name.into(), key, device };
        match key {
            HookKey::Port { base, len } => {
                let (start, end) = (base as u32, base as u32 + len.max(1) as u32);
                if let Some(o) = self.ports.values().find(|o| match o.key {
                    HookKey::Port { base: b, len: l } => (b as u32) < end && start < b as u32 + l.max(1) as u32,
                    _ => false,
                }) {
                    return Err(conflict(o));
                }
                self.ports.insert(base, owner);
            }
            HookKey::Mmio { base, len } => {
                let end = base.saturating_add(len.max(1));
                if let Some(o) = self.mmio.values().find(|o| match o.key {
                    HookKey::Mmio { base: b, len: l } => b < end && base < b.saturating_add(l.max(1)),
                    _ => false,
                }) {
                    return Err(conflict(o));
                }
                self.mmio.insert(base, owner);
            }
            HookKey::Msr(index) => {
                if let Some(o) = self.msrs.get(&index) {
                    return Err(conflict(o));
                }
                self.msrs.insert(index, owner);
            }
            HookKey::Hypercall(nr) => {
                if let Some(o) = self.hypercalls.get(&nr) {
                    return Err(conflict(o));
                }
                self.hypercalls.insert(nr, owner);
            }
        }
        Ok(())
    }

    /// Marks `port` as the hypercall port: a write there is decoded from the vCPU's registers.
    pub fn set_hypercall_port(&mut self, port: u16) {
        self.hypercall_port = Some(port);
    }

    pub fn hypercall_port(&self) -> Option<u16> {
        self.hypercall_port
    }

    fn claim(o: &Owner) -> Claim<'_> {
        Claim { name: &o.name, key: o.key, device: &o.device }
    }

    #[inline]
    pub fn port(&self, port: u16) -> Option<Claim<'_>> {
        range_lookup(&self.ports, port, |k| match *k {
            HookKey::Port { base, len } => (port as u32) < base as u32 + len as u32,
            _ => false,
        })
        .map(Self::claim)
    }

    pub fn mmio(&self, addr: u64) -> Option<Claim<'_>> {
        range_lookup(&self.mmio, addr, |k| match *k {
            HookKey::Mmio { base, len } => addr - base < len,
            _ => false,
        })
        .map(Self::claim)
    }

    pub fn msr(&self, index: u32) -> Option<Claim<'_>> {
        self.msrs.get(&index).map(Self::claim)
    }

    pub fn hypercall(&self, nr: u32) -> Option<Claim<'_>> {
        self.hypercalls.get(&nr).map(Self::claim)
    }

    /// Every MSR some device claimed: the VMM asks KVM to exit to user space for these.
    pub fn hooked_msrs(&self) -> Vec<u32> {
        self.msrs.keys().copied().collect()
    }

    /// Every hook, for listings and tests.
    pub fn all(&self) -> Vec<(String, HookKey)> {
        [&self.ports as &dyn HookMap, &self.mmio, &self.msrs, &self.hypercalls]
            .iter()
            .flat_map(|m| m.owners())
            .map(|o| (o.name.to_string(), o.key))
            .collect()
    }
}

trait HookMap {
    fn owners(&self) -> Vec<&Owner>;
}
impl<K> HookMap for BTreeMap<K, Owner> {
    fn owners(&self) -> Vec<&Owner> {
        self.values().collect()
    }
}

/// Kinds of exit counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    PortIn,
    PortOut,
    MmioRead,
    MmioWrite,
    MsrRead,
    MsrWrite,
    Hypercall,
    Halt,
    Interrupted,
    Shutdown,
    /// A guest kernel instruction KVM could not emulate, carried out by the VMM (`emulate`).
    Emulated,
    Other,
}

impl ExitKind {
    pub const ALL: [ExitKind; 12] = [
        ExitKind::PortIn,
        ExitKind::PortOut,
        ExitKind::MmioRead,
        ExitKind::MmioWrite,
        ExitKind::MsrRead,
        ExitKind::MsrWrite,
        ExitKind::Hypercall,
        ExitKind::Halt,
        ExitKind::Interrupted,
        ExitKind::Shutdown,
        ExitKind::Emulated,
        ExitKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ExitKind::PortIn => "port_in",
            ExitKind::PortOut => "port_out",
            ExitKind::MmioRead => "mmio_read",
            ExitKind::MmioWrite => "mmio_write",
            ExitKind::MsrRead => "msr_read",
            ExitKind::MsrWrite => "msr_write",
            ExitKind::Hypercall => "hypercall",
            ExitKind::Halt => "halt",
            ExitKind::Interrupted => "interrupted",
            ExitKind::Shutdown => "shutdown",
            ExitKind::Emulated => "emulated",
            ExitKind::Other => "other",
        }
    }
}

/// One vCPU's counters, on cache lines of their own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct VcpuCounters([AtomicU64; ExitKind::ALL.len()]);

/// Per-kind exit counters, readable at any time from any thread. Each vCPU has its own slots and
/// is their only writer, so counting is a plain load and store (no locked instruction, no line
/// shared between vCPUs on the exit path); readers add the slots up.
#[derive(Debug)]
pub struct ExitCounters {
    per_vcpu: Vec<VcpuCounters>,
}

impl ExitCounters {
    pub fn new(vcpus: usize) -> Self {
        ExitCounters { per_vcpu: (0..vcpus.max(1)).map(|_| VcpuCounters::default()).collect() }
    }

    /// Counts one exit of `vcpu`. Only that vCPU's thread may call this.
    #[inline]
    pub fn count(&self, vcpu: usize, kind: ExitKind) {
        let slot = &self.per_vcpu[vcpu].0[kind as usize];
        slot.store(slot.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub fn get(&self, kind: ExitKind) -> u64 {
        self.per_vcpu.iter().map(|c| c.0[kind as usize].load(Ordering::Relaxed)).sum()
    }

    /// Exits of every kind so far.
    pub fn total(&self) -> u64 {
        ExitKind::ALL.iter().map(|k| self.get(*k)).sum()
    }

    /// (name, count) for every kind.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        ExitKind::ALL.iter().map(|k| (k.name(), self.get(*k))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;
    impl Device for Nothing {
        fn handle(&mut self, _: &ExitContext, _: Request<'_>) -> Result<Outcome, DeviceError> {
            Ok(Outcome::Continue)
        }
    }

    fn dev() -> DeviceHandle {
        Arc::new(Mutex::new(Nothing))
    }

    #[test]
    fn lookups_find_the_owner_of_a_range() {
        let mut r = HookRegistry::new();
        r.hook("com1", HookKey::Port { base: 0x3f8, len: 8 }, dev()).unwrap();
        r.hook("exit", HookKey::Port { base: 0xf4, len: 4 }, dev()).unwrap();
        r.hook("scratch", HookKey::Mmio { base: 0xd000_0000, len: 0x1000 }, dev()).unwrap();
        r.hook("msr", HookKey::Msr(0x4c00_0000), dev()).unwrap();
        r.hook("hc", HookKey::Hypercall(2), dev()).unwrap();
        assert_eq!(r.port(0x3f8).unwrap().name, "com1");
        assert_eq!(r.port(0x3ff).unwrap().name, "com1");
        assert!(r.port(0x400).is_none());
        assert!(r.port(0x3f7).is_none());
        assert_eq!(r.port(0xf7).unwrap().name, "exit");
        assert_eq!(r.mmio(0xd000_0fff).unwrap().name, "scratch");
        assert!(r.mmio(0xd000_1000).is_none());
        assert!(r.mmio(0).is_none());
        assert_eq!(r.msr(0x4c00_0000).unwrap().name, "msr");
        assert!(r.msr(0x10).is_none());
        assert_eq!(r.hypercall(2).unwrap().name, "hc");
        assert_eq!(r.all().len(), 5);
        assert_eq!(r.hooked_msrs(), vec![0x4c00_0000]);
    }

    #[test]
    fn overlapping_claims_are_refused_with_both_names() {
        let mut r = HookRegistry::new();
        r.hook("com1", HookKey::Port { base: 0x3f8, len: 8 }, dev()).unwrap();
        let err = r.hook("other", HookKey::Port { base: 0x3fc, len: 1 }, dev()).unwrap_err();
        assert_eq!(err.existing_owner, "com1");
        assert!(err.to_string().contains("other"));
        r.hook("below", HookKey::Port { base: 0x3f0, len: 8 }, dev()).unwrap();
        r.hook("m", HookKey::Mmio { base: 0x1000, len: 0x1000 }, dev()).unwrap();
        assert!(r.hook("m2", HookKey::Mmio { base: 0x1fff, len: 1 }, dev()).is_err());
        r.hook("m3", HookKey::Mmio { base: 0x2000, len: 1 }, dev()).unwrap();
        r.hook("h", HookKey::Hypercall(1), dev()).unwrap();
        assert!(r.hook("h2", HookKey::Hypercall(1), dev()).is_err());
    }

    #[test]
    fn counters_count_by_kind() {
        let c = ExitCounters::new(2);
        c.count(0, ExitKind::PortOut);
        c.count(1, ExitKind::PortOut);
        c.count(1, ExitKind::Hypercall);
        assert_eq!(c.get(ExitKind::PortOut), 2, "summed over vCPUs");
        assert_eq!(c.total(), 3);
        let snap = c.snapshot();
        assert!(snap.contains(&("hypercall", 1)));
        assert!(snap.contains(&("mmio_read", 0)));
    }
}
