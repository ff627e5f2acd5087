//! clowder's VMM test guest: one small kernel image that exercises one guest-ABI behaviour per
//! boot, chosen with `test=<name>` on its command line. What each test does and reports is in
//! `README.md`; the host-side tests in `vmm/core/tests/guest_*.rs` assert on exactly that.
//!
//! Everything here runs in ring 0, which PVM emulates instruction by instruction (~0.26 us
//! each), so the code avoids loops it does not need: static page tables, no BSS clearing (guest
//! RAM starts zeroed), no serial line-status polling.

#![no_std]
#![no_main]

mod arch;
mod boot;
mod cases;
mod cmdline;
mod hypercall;
mod paging;
mod serial;
mod start_info;
mod zero_page;

use boot::BootPath;
use cmdline::Cmdline;

/// Exit statuses besides a test's own.
pub const EXIT_PASS: u8 = 0;
pub const EXIT_FAIL: u8 = 1;
pub const EXIT_BAD_CMDLINE: u8 = 2;
pub const EXIT_NO_CHANNEL: u8 = 3;
pub const EXIT_EXCEPTION: u8 = 0xee;
pub const EXIT_PANIC: u8 = 0xef;

/// Where the VMM puts the command line; used only if the start info is unusable.
const DEFAULT_CMDLINE_ADDRESS: u64 = 0x2_0000;

/// Everything a test needs from the boot: who we are and what the command line says.
pub struct Boot {
    pub cpu: u64,
    pub path: BootPath,
    pub start_info_address: u64,
    pub start_info: Option<start_info::StartInfo>,
    /// The Linux entry's zero page (`RSI` there), instead of a start info.
    pub zero_page: Option<zero_page::ZeroPage>,
    pub cmdline: Cmdline,
}

impl Boot {
    /// vCPUs the VMM says the VM has (`clowder.cpus`), or the `cpus=` test parameter (QEMU).
    pub fn cpus(&self) -> u64 {
        self.cmdline.hex("clowder.cpus").or_else(|| self.cmdline.number("cpus")).unwrap_or(1)
    }
}

/// Called by the boot code on the vCPU's own stack.
pub extern "C" fn guest_main(cpu: u64, start_info_address: u64, path: u64) -> ! {
    let path = BootPath::from_raw(path);
    if path == BootPath::Sipi {
        // An application processor woken by the `sipi` test; it has no start info.
        cases::sipi_application_processor(cpu)
    }
    // The Linux entry passes the zero page where the others pass the hvm_start_info.
    let zero_page = (path == BootPath::Linux).then(|| zero_page::ZeroPage::at(start_info_address));
    let start_info = if zero_page.is_some() { None } else { start_info::read(start_info_address) };
    let cmdline_address = match (zero_page, start_info) {
        (Some(page), _) => page.cmdline_address(),
        (None, Some(info)) => info.cmdline_paddr,
        (None, None) => DEFAULT_CMDLINE_ADDRESS,
    };
    let cmdline = Cmdline(start_info::cmdline_at(cmdline_address));
    let hypercall_port = cmdline.hex("clowder.hypercall_port").unwrap_or(0x510) as u16;
    let exit_port = cmdline.hex("clowder.exit_port").unwrap_or(0xf4) as u16;
    hypercall::set_ports(hypercall_port, exit_port);
    let boot = Boot { cpu, path, start_info_address, start_info, zero_page, cmdline };
    cases::run(&boot)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("testguest: panic: {}", info);
    hypercall::exit(EXIT_PANIC)
}
