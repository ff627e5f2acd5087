//! clowder's lightweight kernel: boots through PVH (or clowder-vmm's 64-bit direct start),
//! takes the machine's memory as contiguous ranges, loads one static Linux executable from
//! PVH module 0 with all its memory mapped up front, and serves its system calls until it
//! exits. No timer interrupts, no demand paging: on a host where every kernel instruction is
//! emulated (shared/notes/pvm.md) the kernel's job is to stay out of the way.

#![no_std]
#![no_main]

extern crate alloc;

mod arch;
mod bootinfo;
mod clock;
mod cmdline;
mod console;
mod fs;
mod job;
mod machine;
mod mm;
mod sched;
mod syscall;
mod trap;

use bootinfo::BootInfo;
use cmdline::JobOptions;
use console::log;

/// Called by the boot code on the boot stack, with paging on and interrupts off.
#[no_mangle]
extern "C" fn kernel_main(start_info: u64) -> ! {
    let boot_tsc = arch::cpu::read_tsc();
    arch::serial::init();
    arch::tables::init_boot_cpu();
    sched::set_apic_id(0, arch::apic::init_local_apic());
    sched::mark_cpu_tables_ready();
    arch::cpu::mask_legacy_pics();
    let boot = match BootInfo::parse(start_info) {
        Ok(boot) => boot,
        Err(error) => panic!("no usable PVH start info at {start_info:#x}: {error:?}"),
    };
    machine::set_exit_port(cmdline::exit_port(boot.command_line()));
    // Every console byte is a VM exit (~9 us on PVM): boot details only when asked for.
    let verbose = cmdline::has_flag(boot.command_line(), "lwk.verbose");
    if verbose {
        log!("lightweight kernel starting; command line: {}", boot.command_line());
    }

    mm::init(&boot);
    if verbose {
        log!("memory: {} MiB free", mm::pmem::total_free() >> 20);
        mm::pmem::for_each_free(|range| log!("  free {:#x}..{:#x}", range.start, range.end));
    }
    arch::cpu::enable_user_fpu();
    clock::init(boot_tsc, !cmdline::started_by_clowder_vmm(boot.command_line()));

    let options = JobOptions::parse(boot.command_line()).unwrap_or_else(|error| panic!("bad option {}", error.0));
    match job::load(boot.modules().first(), &options) {
        Ok(frame) => arch::trap::enter_user(&frame),
        Err(error) => panic!("cannot load the job: {error:?}"),
    }
}

/// Every other vCPU of a 64-bit direct start arrives here (RDI = its index) on its own stack,
/// while CPU 0 boots; it loads its tables and joins the scheduler once the job is loaded.
#[no_mangle]
extern "C" fn ap_main(cpu: u64) -> ! {
    // Whether RDTSCP exists is learnt by CPU 0; wait until it has set up the shared tables.
    while !sched::cpu_tables_ready() {
        core::hint::spin_loop();
    }
    if !arch::tables::can_run_smp() {
        arch::cpu::halt_forever();
    }
    arch::tables::init_cpu(cpu as usize, 0);
    sched::set_apic_id(cpu as usize, arch::apic::init_local_apic());
    arch::cpu::enable_user_fpu();
    arch::paging::enable_global_pages();
    sched::join_cpu(cpu as usize)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    match info.location() {
        Some(location) => console::print_kernel_line_in_panic(format_args!("panic: {} (at {location})", info.message())),
        None => console::print_kernel_line_in_panic(format_args!("panic: {}", info.message())),
    }
    machine::exit(machine::PANIC_STATUS)
}
