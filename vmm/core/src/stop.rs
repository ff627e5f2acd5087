//! Why a VM stopped, with the evidence (vCPU registers) when the guest is at fault.

use std::fmt;

/// A vCPU's registers at the moment something went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegisterDump {
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
    pub cs: u16,
    pub cpl: u8,
}

impl fmt::Display for RegisterDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rip={:#018x} rsp={:#018x} rflags={:#x} cs={:#x} cpl={}\n  \
             rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} rbp={:#x}\n  \
             cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x}",
            self.rip,
            self.rsp,
            self.rflags,
            self.cs,
            self.cpl,
            self.rax,
            self.rbx,
            self.rcx,
            self.rdx,
            self.rsi,
            self.rdi,
            self.rbp,
            self.cr0,
            self.cr2,
            self.cr3,
            self.cr4,
            self.efer
        )
    }
}

/// Why the VM ended. `exit_code` maps each to the `clowder-vmm` process status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The guest wrote its status to the exit port.
    GuestExit(u8),
    /// `Vm::stop` (the control socket, SIGTERM) asked for it.
    Requested,
    /// A vCPU triple-faulted (KVM_EXIT_SHUTDOWN).
    TripleFault { vcpu: usize, regs: Box<RegisterDump> },
    /// An exit nobody handles: an unhooked port/MMIO/MSR/hypercall or an exit kind the VMM does
    /// not implement.
    UnhandledExit { vcpu: usize, what: String, regs: Box<RegisterDump> },
    /// A device refused what the guest did.
    DeviceError { vcpu: usize, device: String, reason: String, regs: Box<RegisterDump> },
    /// No sign of life from the guest within the watchdog timeout.
    Watchdog { silent_ms: u64 },
    /// KVM itself failed (an ioctl error, an internal error exit).
    Internal { vcpu: Option<usize>, what: String },
}

impl StopReason {
    /// Process exit status: the guest's own status, or a fixed code per failure kind.
    pub fn exit_code(&self) -> i32 {
        match self {
            StopReason::GuestExit(status) => *status as i32,
            StopReason::Requested => 0,
            StopReason::Watchdog { .. } => 124,
            StopReason::TripleFault { .. } => 125,
            StopReason::UnhandledExit { .. } | StopReason::DeviceError { .. } => 126,
            StopReason::Internal { .. } => 127,
        }
    }

    pub fn is_failure(&self) -> bool {
        !matches!(self, StopReason::GuestExit(_) | StopReason::Requested)
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::GuestExit(s) => write!(f, "guest exited with status {s}"),
            StopReason::Requested => write!(f, "stopped on request"),
            StopReason::TripleFault { vcpu, regs } => {
                write!(f, "vCPU {vcpu} triple-faulted (the guest reset itself)\n  {regs}")
            }
            StopReason::UnhandledExit { vcpu, what, regs } => {
                write!(f, "vCPU {vcpu}: unhandled exit: {what}\n  {regs}")
            }
            StopReason::DeviceError { vcpu, device, reason, regs } => {
                write!(f, "vCPU {vcpu}: device {device:?} rejected a guest access: {reason}\n  {regs}")
            }
            StopReason::Watchdog { silent_ms } => {
                write!(f, "guest stopped responding: no exit or heartbeat for {silent_ms} ms")
            }
            StopReason::Internal { vcpu: Some(v), what } => write!(f, "vCPU {v}: {what}"),
            StopReason::Internal { vcpu: None, what } => write!(f, "{what}"),
        }
    }
}
