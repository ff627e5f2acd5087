//! CPUID as the guest sees it: what KVM supports, with each vCPU's APIC id filled in.

use kvm_bindings::kvm_cpuid_entry2;

const LEAF_FEATURES: u32 = 0x1;
const LEAF_EXTENDED_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXTENDED_TOPOLOGY: u32 = 0x1f;
/// KVM's paravirtual feature leaf (KVM_CPUID_FEATURES).
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
/// KVM_CPUID_FEATURES EAX bit 5: the steal-time record (KVM_FEATURE_STEAL_TIME).
const EAX_KVM_STEAL_TIME: u32 = 1 << 5;
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
    /// KVM rewrites the steal-time record, bumping its version, at every KVM_RUN after an exit
    /// to the VMM, and Linux's reader (`kvm_steal_clock`) retries until two reads of the
    /// version agree: when the VMM's profile op single-steps the guest kernel (an exit at every
    /// instruction) the reader never got out (99.4% of a profile). So Linux guests on PVM are
    /// not offered it; they lose steal-time accounting, and a tick's reads of it.
    pub hide_steal_time: bool,
}

/// Words for a Linux guest's command line on PVM: the features whose kernel-mode instructions
/// PVM's emulator cannot execute, which Linux would otherwise patch into its text (measured with
/// the small guest kernel, docs/linux-guest.md). `clearcpuid` by feature number: CX16 (141,
/// CMPXCHG16B), POPCNT (151, hweight), FSGSBASE (288, the entry code), INVPCID (298, TLB
/// flushes), SMAP (308, CLAC/STAC around user accesses), and XSAVE's variants XSAVEOPT,
/// XSAVEC, XGETBV1 and XSAVES (320-323; PVM answers CPUID leaf 0xD itself): XSAVE and XRSTOR
/// also fail there, but the VMM carries them out (`emulate`), so Linux must use only those.
/// And, for speed, ERMS (297) and FSRM (580): with them Linux clears and copies pages and
/// user memory by bytes (`rep stosb`, `rep movsb`), which PVM's emulator carries out one
/// element at a time, 4096 steps a page; without them, by 8-byte elements (`rep stosq`, 512
/// steps a page), which measured faster here than its unrolled loops without REP_GOOD too
/// (docs/linux-guest.md, "Touching memory").
pub const LINUX_ON_PVM: [&str; 1] = ["clearcpuid=141,151,288,297,298,308,320,321,322,323,580"];

impl HostQuirks {
    pub fn for_guest(linux_guest: bool) -> Self {
        let pvm_linux = on_pvm() && linux_guest;
        HostQuirks { hide_unemulated_features: pvm_linux, hide_steal_time: pvm_linux }
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
            LEAF_KVM_FEATURES if quirks.hide_steal_time => entry.eax &= !EAX_KVM_STEAL_TIME,
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
            kvm_cpuid_entry2 { function: LEAF_KVM_FEATURES, eax: 0x0100_0003 | EAX_KVM_STEAL_TIME, ..Default::default() },
        ];
        patch_for_vcpu(&mut entries, 3, 4, HostQuirks::default());
        assert_eq!(entries[0].ebx >> 24, 3);
        assert_eq!((entries[0].ebx >> 16) & 0xff, 4);
        assert_eq!(entries[0].ebx & 0xffff, 0x0800, "CLFLUSH size and brand kept");
        assert_ne!(entries[0].ecx & ECX_HYPERVISOR, 0);
        assert_eq!(entries[1].edx, 3);
        assert_eq!(entries[2].eax, 42);
        assert_ne!(entries[0].ecx & ECX_CX16, 0, "kept where the host can run it");
        assert_eq!(entries[3].eax, 0x0100_0003 | EAX_KVM_STEAL_TIME, "steal time kept");
        patch_for_vcpu(&mut entries, 3, 4, HostQuirks { hide_unemulated_features: true, hide_steal_time: false });
        assert_eq!(entries[0].ecx & ECX_CX16, 0);
        assert_eq!(entries[3].eax, 0x0100_0003 | EAX_KVM_STEAL_TIME);
        patch_for_vcpu(&mut entries, 3, 4, HostQuirks { hide_unemulated_features: true, hide_steal_time: true });
        assert_eq!(entries[3].eax, 0x0100_0003, "only the steal-time bit goes");
    }
}
