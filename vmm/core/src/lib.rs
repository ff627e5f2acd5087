//! clowder's virtual machine monitor as a library: create a VM from a `VmConfig`, start, pause,
//! resume, stop and wait for it; share its memory and channel with other processes; add and
//! remove memory regions while it runs. `clowder-vmm` and the node daemon embed it.
//!
//! Layout: `arch` is pure boot-time setup (unit-tested without KVM); `memory`, `vcpu`, `vm` and
//! `devices` drive KVM; `hooks` is the single registry every exit kind goes through.

pub mod arch;
pub mod boot;
pub mod control;
pub mod devices;
pub mod emulate;
pub mod hooks;
pub mod interrupts;
pub mod memory;
pub mod pci;
pub mod profile;
pub mod stop;
pub mod vcpu;
pub mod vm;

pub use hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
pub use memory::{FileRun, MemoryError, RegionAccess, RegionInfo};
pub use stop::{RegisterDump, StopReason};
pub use vm::{ExtraDevice, RunState, Vm, VmHandle};
pub use vmm_config::VmConfig;

/// Why a VM could not be built or an operation on it failed.
#[derive(Debug)]
pub enum VmError {
    /// The configuration does not work (named key and reason).
    Config(String),
    /// A KVM call failed.
    Kvm(String),
    Memory(MemoryError),
    /// The operation does not fit the VM's current state.
    State(String),
}

impl std::fmt::Display for VmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmError::Config(e) | VmError::Kvm(e) | VmError::State(e) => f.write_str(e),
            VmError::Memory(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for VmError {}

impl From<MemoryError> for VmError {
    fn from(e: MemoryError) -> Self {
        VmError::Memory(e)
    }
}
