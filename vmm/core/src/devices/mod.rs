//! Device models, created by kind name from the configuration. Each one claims its exits in the
//! hook registry the same way (see `hooks`).

mod channel;
mod exit;
mod hypercall;
mod scratch;
mod serial;
mod tap;
pub mod virtio_net;
#[cfg(test)]
mod virtio_net_tests;

pub use channel::ChannelEndpoint;
pub use hypercall::{Report, HC_HEARTBEAT, HC_NOP, HC_READY, HC_REPORT};
pub use tap::Tap;

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use vmm_config::{DeviceConfig, DeviceKind};

use crate::hooks::{Device, HookKey, HookRegistry};
use crate::memory::GuestMemory;
use crate::vm::VmShared;
use crate::VmError;

/// What a device may use while it is being built.
pub struct DeviceEnv<'a> {
    pub vm: &'a VmFd,
    pub memory: &'a GuestMemory,
    pub shared: &'a Arc<VmShared>,
    pub registry: &'a mut HookRegistry,
    pub interrupts: &'a mut crate::interrupts::InterruptRouter,
    /// `key=value` words the VMM appends to the kernel command line.
    pub cmdline_extra: &'a mut Vec<String>,
    /// Set by the channel device.
    pub channel: &'a mut Option<ChannelEndpoint>,
}

impl DeviceEnv<'_> {
    /// Claims every key for one device instance.
    pub fn hook_all<D: Device + 'static>(&mut self, name: &str, keys: &[HookKey], device: D) -> Result<(), VmError> {
        let handle: crate::hooks::DeviceHandle = Arc::new(Mutex::new(device));
        for key in keys {
            self.registry.hook(name, *key, handle.clone()).map_err(|e| VmError::Config(format!("device.{name}: {e}")))?;
        }
        Ok(())
    }
}

/// Creates one configured device and registers its hooks.
pub fn create(config: &DeviceConfig, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    let name = config.name.as_str();
    match &config.kind {
        DeviceKind::Serial { port, irq, output } => serial::create(name, *port, *irq, output, env),
        DeviceKind::Exit { port } => exit::create(name, *port, env),
        DeviceKind::Hypercall { port } => hypercall::create(name, *port, env),
        DeviceKind::Channel { size, doorbell_port, vector } => channel::create(name, *size, *doorbell_port, *vector, env),
        DeviceKind::MmioScratch { base, size } => scratch::create_mmio(name, *base, *size, env),
        DeviceKind::MsrScratch { msrs } => scratch::create_msr(name, msrs, env),
        DeviceKind::VirtioNet { base, irq, tap, host } => virtio_net::create(name, *base, *irq, tap, *host, env),
    }
}
