//! CPUID as the guest sees it: what KVM supports, with each vCPU's APIC id filled in.

use kvm_bindings::kvm_cpuid_entry2;

const LEAF_FEATURES: u32 = 0x1;
const LEAF_EXTENDED_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXTENDED_TOPOLOGY: u32 = 0x1f;
/// CPUID.1:ECX bit 31: running under a hypervisor.
const ECX_HYPERVISOR: u32 = 1 << 31;
/// CPUID.1:ECX bit 13: CMPXCHG16B.
const ECX_CX16: u32 = 1 << 13;

/// Host and guest facts that change what the guest may be told.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostQuirks {
    /// PVM emulates guest kernel-mode code, and its instruction emulator cannot execute
    /// CMPXCHG16B, which a Linux kernel uses in SLUB when CPUID offers it; so it is hidden from
    /// Linux guests on PVM. Other leaves PVM answers itself whatever the table says, so the
    /// rest of what Linux must not use there goes on its command line ([`LINUX_ON_PVM`]).
    pub hide_unemulated_features: bool,
}

/// Words for a Linux guest's command line on PVM: the features whose kernel-mode instructions
/// PVM's emulator cannot execute, which Linux would otherwise patch into its text (measured with
/// the small guest kernel, docs/linux-guest.md). `clearcpuid` by feature number: CX16 (141,
/// CMPXCHG16B), POPCNT (151, hweight), FSGSBASE (288, the entry code), INVPCID (298, TLB
/// flushes), SMAP (308, CLAC/STAC around user accesses), and XSAVE's variants XSAVEOPT,
/// XSAVEC, XGETBV1 and XSAVES (320-323; PVM answers CPUID leaf 0xD itself): XSAVE and XRSTOR
/// also fail there, but the VMM carries them out (`emulate`), so Linux must use only those.
pub const LINUX_ON_PVM: [&str; 1] = ["clearcpuid=141,151,288,298,308,320,321,322,323"];

impl HostQuirks {
    pub fn for_guest(linux_guest: bool) -> Self {
        HostQuirks { hide_unemulated_features: on_pvm() && linux_guest }
    }
}

pub fn on_pvm() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

/// Patches `entries` (KVM's supported set) for vCPU `index` of a VM with `count` vCPUs: the
/// initial APIC id is the vCPU index, the logical processor count is the VM's.
pub fn patch_for_vcpu(entries: &mut [kvm_cpuid_entry2], index: u32, count: u32, quirks: HostQuirks) {
    for entry in entries.iter_mut() {
        match entry.function {
            LEAF_FEATURES => {
                entry.ebx = (entry.ebx & 0x0000_ffff) | (index << 24) | ((count.min(255)) << 16);
                entry.ecx |= ECX_HYPERVISOR;
                if quirks.hide_unemulated_features {
                    entry.ecx &= !ECX_CX16;
                }
            }
            LEAF_EXTENDED_TOPOLOGY | LEAF_V2_EXTENDED_TOPOLOGY => entry.edx = index,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apic_id_and_count_are_set() {
        let mut entries = vec![
            kvm_cpuid_entry2 { function: 1, ebx: 0xdead_0800, ecx: ECX_CX16, ..Default::default() },
            kvm_cpuid_entry2 { function: 0xb, index: 0, edx: 7, ..Default::default() },
            kvm_cpuid_entry2 { function: 0x4, eax: 42, ..Default::default() },
        ];
        patch_for_vcpu(&mut entries, 3, 4, HostQuirks::default());
        assert_eq!(entries[0].ebx >> 24, 3);
        assert_eq!((entries[0].ebx >> 16) & 0xff, 4);
        assert_eq!(entries[0].ebx & 0xffff, 0x0800, "CLFLUSH size and brand kept");
        assert_ne!(entries[0].ecx & ECX_HYPERVISOR, 0);
        assert_eq!(entries[1].edx, 3);
        assert_eq!(entries[2].eax, 42);
        assert_ne!(entries[0].ecx & ECX_CX16, 0, "kept where the host can run it");
        patch_for_vcpu(&mut entries, 3, 4, HostQuirks { hide_unemulated_features: true });
        assert_eq!(entries[0].ecx & ECX_CX16, 0);
    }
}
