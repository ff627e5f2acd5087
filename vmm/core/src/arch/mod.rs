//! Pure x86-64 boot-time setup: guest layout, memory map, PVH and Linux boot structures, GDT,
//! identity page tables, initial registers, CPUID. No KVM calls here, so all of it is unit-tested.

pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod memmap;
pub mod paging;
pub mod pvh;
pub mod regs;
pub mod zero_page;
