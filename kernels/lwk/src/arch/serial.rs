//! COM1, output only. The port is always a virtual 16550 here (QEMU, clowder-vmm) whose
//! transmitter never fills, so bytes are written without polling the line status: each port
//! access is a VM exit, and polling would double them.

use super::cpu::outb;
pub use guest_arch::com1_write as write;
use guest_arch::COM1;

pub fn init() {
    outb(COM1 + 1, 0x00); // no interrupts
    outb(COM1 + 3, 0x80); // divisor latch
    outb(COM1, 0x01); // 115200 baud
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03); // 8N1
    outb(COM1 + 2, 0xc7); // FIFO on
}
