//! Everything that needs `unsafe`: boot code, CPU tables, traps, page tables, physical memory
//! access, the kernel heap and the serial port. The rest of the kernel is safe Rust (the
//! crate denies `unsafe_code`; this module allows it).

#![allow(unsafe_code)]

pub mod apic;
pub mod boot;
pub mod channel;
pub mod cpu;
pub mod fastcall;
pub mod fpu;
pub mod heap;
pub mod paging;
pub mod phys;
pub mod serial;
pub mod sync;
pub mod tables;
pub mod trap;
