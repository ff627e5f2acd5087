//! The enclave channel's host side: formats the ring pair in reserved guest RAM, binds the
//! guest→host doorbell port to an ioeventfd and the host→guest interrupt to an irqfd whose MSI
//! route raises the channel vector on vCPU 0. The rings themselves are `clowder-channel`.

use clowder_channel::Channel;
use kvm_ioctls::{IoEventAddress, NoDatamatch};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
use crate::VmError;

use super::DeviceEnv;

/// The APIC the channel interrupt goes to (vCPU 0, the one the guest kernel boots on).
const CHANNEL_APIC_ID: u8 = 0;

/// Everything a host-side driver of the channel needs.
pub struct ChannelEndpoint {
    pub gpa: u64,
    pub size: u64,
    /// Offset of the channel in the VM's RAM memfd.
    pub memfd_offset: u64,
    pub vector: u8,
    pub doorbell_port: u16,
    /// Becomes readable when the guest rings the doorbell.
    pub doorbell: EventFd,
    /// Write 1 to raise the channel vector in the guest.
    pub interrupt: EventFd,
    host_addr: *mut u8,
    /// Keeps the mapping behind `host_addr` alive as long as the endpoint.
    _mapping: GuestMemoryMmap,
}

// SAFETY: host_addr points into `_mapping`, which the endpoint keeps alive.
unsafe impl Send for ChannelEndpoint {}
// SAFETY: the ring protocol is written for concurrent access from two address spaces, so from
// two threads as well.
unsafe impl Sync for ChannelEndpoint {}

impl ChannelEndpoint {
    /// A view of the formatted channel, valid while this endpoint lives.
    pub fn channel(&self) -> Channel {
        // SAFETY: the region was formatted by `create` and stays mapped while `self` lives.
        unsafe { Channel::attach(self.host_addr, self.size as usize) }.expect("channel formatted at creation")
    }

    /// Raises the channel vector in the guest (the host→guest doorbell).
    pub fn ring_guest(&self) -> std::io::Result<()> {
        self.interrupt.write(1)
    }
}

/// Reads of the doorbell port (writes never reach user space: the ioeventfd takes them).
struct DoorbellPort;

impl Device for DoorbellPort {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::PortRead { data, .. } => {
                data.fill(0);
                Ok(Outcome::Continue)
            }
            Request::PortWrite { .. } => Ok(Outcome::Continue),
            other => Err(DeviceError(format!("channel doorbell cannot handle {other:?}"))),
        }
    }
}

pub fn create(name: &str, size: u64, doorbell_port: u16, vector: u8, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    let layout = env.memory.layout();
    let region = layout
        .channel
        .filter(|c| c.size == size)
        .ok_or_else(|| VmError::Config(format!("device.{name}.size: the guest layout reserved no {size}-byte channel")))?;
    let host_addr = env.memory.host_address(region.gpa, region.size).expect("channel lies in low RAM");
    // SAFETY: the region is reserved guest RAM mapped for the VM's lifetime; the guest has not
    // started yet, so nobody else touches it while it is formatted.
    unsafe { Channel::init(host_addr, size as usize) }.map_err(|e| VmError::Config(format!("device.{name}.size: {e:?}")))?;

    let kvm_err = |what: &str, e: std::io::Error| VmError::Kvm(format!("channel {what}: {e}"));
    let doorbell = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| kvm_err("doorbell eventfd", e))?;
    env.vm
        .register_ioevent(&doorbell, &IoEventAddress::Pio(doorbell_port as u64), NoDatamatch)
        .map_err(|e| VmError::Kvm(format!("channel doorbell ioeventfd on port {doorbell_port:#x}: {e}")))?;
    let interrupt = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| kvm_err("interrupt eventfd", e))?;
    let gsi = env.interrupts.add_msi(vector, CHANNEL_APIC_ID);
    env.vm.register_irqfd(&interrupt, gsi).map_err(|e| VmError::Kvm(format!("channel irqfd on GSI {gsi}: {e}")))?;

    env.cmdline_extra.push(format!("clowder.channel={:#x},{:#x}", region.gpa, region.size));
    env.cmdline_extra.push(format!("clowder.channel_vector={vector:#x}"));
    env.cmdline_extra.push(format!("clowder.channel_port={doorbell_port:#x}"));
    *env.channel = Some(ChannelEndpoint {
        gpa: region.gpa,
        size: region.size,
        memfd_offset: region.file_offset,
        vector,
        doorbell_port,
        doorbell,
        interrupt,
        host_addr,
        _mapping: env.memory.guest_memory().clone(),
    });
    env.hook_all(name, &[HookKey::Port { base: doorbell_port, len: 4 }], DoorbellPort)
}
