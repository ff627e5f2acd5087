//! Initial register state for each way a vCPU can start (docs/guest-abi.md, "How vCPUs start").

use super::gdt::{self, boot_gdt, CODE32_SELECTOR, CODE64_SELECTOR, DATA_SELECTOR, TSS_SELECTOR};
use super::layout::*;
use kvm_bindings::{kvm_regs, kvm_sregs};

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_SCE: u64 = 1 << 0;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const EFER_NXE: u64 = 1 << 11;
/// Bit 1 of RFLAGS is reserved and always set.
const RFLAGS_RESERVED: u64 = 1 << 1;

/// How a vCPU enters the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    /// PVH: 32-bit protected mode, paging off, `EBX` = start_info.
    Pvh32 { entry: u64 },
    /// 64-bit mode on the identity page tables; `RDI` = vCPU index, `RSI` = start_info.
    Long64 { entry: u64, vcpu_index: u64 },
    /// Linux boot protocol 64-bit entry: `RSI` = zero page.
    Linux64 { entry: u64 },
}

fn descriptor_table_segments(sregs: &mut kvm_sregs, code_selector: u16) {
    let gdt = boot_gdt();
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (gdt.len() * 8 - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    let data = gdt::segment(gdt[(DATA_SELECTOR >> 3) as usize], DATA_SELECTOR);
    sregs.cs = gdt::segment(gdt[(code_selector >> 3) as usize], code_selector);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = gdt::segment(gdt[(TSS_SELECTOR >> 3) as usize], TSS_SELECTOR);
}

/// Special registers for `mode`, starting from what KVM reported for the fresh vCPU (so that
/// fields this code does not set keep KVM's reset values).
pub fn special_registers(mut sregs: kvm_sregs, mode: StartMode) -> kvm_sregs {
    match mode {
        StartMode::Pvh32 { .. } => {
            descriptor_table_segments(&mut sregs, CODE32_SELECTOR);
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr3 = 0;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
        StartMode::Long64 { .. } | StartMode::Linux64 { .. } => {
            descriptor_table_segments(&mut sregs, CODE64_SELECTOR);
            sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
            sregs.cr3 = PML4_ADDR;
            sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
            sregs.efer = EFER_LME | EFER_LMA | EFER_SCE | EFER_NXE;
        }
    }
    sregs
}

pub fn general_registers(mode: StartMode) -> kvm_regs {
    let mut regs = kvm_regs { rflags: RFLAGS_RESERVED, ..Default::default() };
    match mode {
        StartMode::Pvh32 { entry } => {
            regs.rip = entry;
            regs.rbx = START_INFO_ADDR;
        }
        StartMode::Long64 { entry, vcpu_index } => {
            regs.rip = entry;
            regs.rdi = vcpu_index;
            regs.rsi = START_INFO_ADDR;
        }
        StartMode::Linux64 { entry } => {
            regs.rip = entry;
            regs.rsi = ZERO_PAGE_ADDR;
            regs.rsp = BOOT_STACK_TOP;
            regs.rbp = BOOT_STACK_TOP;
        }
    }
    regs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvh_starts_flat_32bit_without_paging() {
        let s = special_registers(kvm_sregs::default(), StartMode::Pvh32 { entry: 0x10_0000 });
        assert_eq!(s.cr0 & CR0_PG, 0);
        assert_eq!(s.cr0 & CR0_PE, 1);
        assert_eq!((s.cs.l, s.cs.db, s.cs.base, s.cs.limit), (0, 1, 0, 0xffff_ffff));
        assert_eq!(s.efer, 0);
        let r = general_registers(StartMode::Pvh32 { entry: 0x10_0000 });
        assert_eq!((r.rip, r.rbx), (0x10_0000, START_INFO_ADDR));
    }

    #[test]
    fn long_mode_start_passes_vcpu_index() {
        let mode = StartMode::Long64 { entry: 0x20_0000, vcpu_index: 3 };
        let s = special_registers(kvm_sregs::default(), mode);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, PML4_ADDR);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.cs.selector, CODE64_SELECTOR);
        let r = general_registers(mode);
        assert_eq!((r.rip, r.rdi, r.rsi, r.rflags), (0x20_0000, 3, START_INFO_ADDR, 2));
    }
}
