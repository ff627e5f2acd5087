//! Interrupt routing: KVM's in-kernel PIC/IOAPIC pins for legacy devices, plus MSI routes that let
//! an irqfd raise a chosen vector on a chosen LAPIC without the guest programming an IOAPIC.
//! KVM_SET_GSI_ROUTING replaces the whole table, so the default pin routes are rebuilt here.

use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;

/// IOAPIC pins: GSIs 0..24 are the legacy interrupt lines.
const IOAPIC_PINS: u32 = 24;
/// xAPIC MSI address: fixed delivery, physical destination in bits 12..20.
const MSI_ADDRESS_BASE: u32 = 0xfee0_0000;

#[derive(Default)]
pub struct InterruptRouter {
    msi_routes: Vec<(u32, u8, u8)>,
}

fn pin_route(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry { gsi, type_: KVM_IRQ_ROUTING_IRQCHIP, ..Default::default() };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

impl InterruptRouter {
    /// Allocates a GSI whose assertion delivers `vector` to the LAPIC with `apic_id` (edge).
    pub fn add_msi(&mut self, vector: u8, apic_id: u8) -> u32 {
        let gsi = IOAPIC_PINS + self.msi_routes.len() as u32;
        self.msi_routes.push((gsi, vector, apic_id));
        gsi
    }

    /// The full routing table: legacy pins as KVM sets them by default, then the MSI routes.
    pub fn entries(&self) -> Vec<kvm_irq_routing_entry> {
        let mut entries = Vec::new();
        for pin in 0..IOAPIC_PINS {
            if pin < 8 {
                entries.push(pin_route(pin, KVM_IRQCHIP_PIC_MASTER, pin));
            } else if pin < 16 {
                entries.push(pin_route(pin, KVM_IRQCHIP_PIC_SLAVE, pin - 8));
            }
            entries.push(pin_route(pin, KVM_IRQCHIP_IOAPIC, pin));
        }
        for &(gsi, vector, apic_id) in &self.msi_routes {
            let mut e = kvm_irq_routing_entry { gsi, type_: KVM_IRQ_ROUTING_MSI, ..Default::default() };
            e.u.msi.address_lo = MSI_ADDRESS_BASE | ((apic_id as u32) << 12);
            e.u.msi.address_hi = 0;
            e.u.msi.data = vector as u32;
            entries.push(e);
        }
        entries
    }

    pub fn commit(&self, vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
        let routing = KvmIrqRouting::from_entries(&self.entries()).map_err(|_| kvm_ioctls::Error::new(libc::E2BIG))?;
        vm.set_gsi_routing(&routing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msi_routes_follow_the_legacy_pins() {
        let mut r = InterruptRouter::default();
        let gsi = r.add_msi(0x40, 1);
        assert_eq!(gsi, 24);
        let entries = r.entries();
        // 16 PIC + 24 IOAPIC routes, then the MSI.
        assert_eq!(entries.len(), 41);
        let msi = entries.last().unwrap();
        assert_eq!((msi.gsi, msi.type_), (24, KVM_IRQ_ROUTING_MSI));
        // SAFETY: reading the union member this entry was built with.
        let (addr, data) = unsafe { (msi.u.msi.address_lo, msi.u.msi.data) };
        assert_eq!(addr, 0xfee0_1000);
        assert_eq!(data, 0x40);
    }
}
