//! The VMM's port-based hypercalls and exit port (docs/guest-abi.md, "Ports and hooks").

use core::arch::asm;
use core::sync::atomic::{AtomicU16, Ordering};

use crate::arch;

pub const NOP: u32 = 0;
pub const READY: u32 = 1;
pub const REPORT: u32 = 2;
pub const HEARTBEAT: u32 = 3;

/// Defaults from the ABI; replaced by `clowder.hypercall_port` / `clowder.exit_port`.
static HYPERCALL_PORT: AtomicU16 = AtomicU16::new(0x510);
static EXIT_PORT: AtomicU16 = AtomicU16::new(0xf4);

pub fn set_ports(hypercall_port: u16, exit_port: u16) {
    HYPERCALL_PORT.store(hypercall_port, Ordering::Relaxed);
    EXIT_PORT.store(exit_port, Ordering::Relaxed);
}

/// `out %eax, (%dx)` with the number in EAX and arguments in RDI, RSI, R8, R9; the VMM puts the
/// result in RAX.
pub fn hypercall(number: u32, arguments: [u64; 4]) -> i64 {
    let result: u64;
    // SAFETY: a port write; the VMM changes only RAX.
    unsafe {
        asm!("out dx, eax",
             in("dx") HYPERCALL_PORT.load(Ordering::Relaxed),
             inout("rax") u64::from(number) => result,
             in("rdi") arguments[0], in("rsi") arguments[1], in("r8") arguments[2], in("r9") arguments[3],
             options(nostack, preserves_flags))
    }
    result as i64
}

/// A report key: up to 8 ASCII bytes packed little-endian into a u64 (so `b"apicid"` reads as
/// "apicid" when the host unpacks it).
pub const fn key(name: &[u8]) -> u64 {
    assert!(name.len() <= 8);
    let mut packed = [0u8; 8];
    let mut index = 0;
    while index < name.len() {
        packed[index] = name[index];
        index += 1;
    }
    u64::from_le_bytes(packed)
}

/// Records (key, value) with the VMM, which adds the vCPU and host core.
pub fn report(name: &[u8], value: u64) {
    hypercall(REPORT, [key(name), value, 0, 0]);
}

/// Ends the VM with `status`; never returns (if nothing listens on the port, the vCPU halts).
pub fn exit(status: u8) -> ! {
    arch::outb(EXIT_PORT.load(Ordering::Relaxed), status);
    arch::halt_forever()
}
