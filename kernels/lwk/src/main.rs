//! clowder's lightweight kernel: boots through PVH (or clowder-vmm's 64-bit direct start),
//! takes the machine's memory as contiguous ranges, loads one static Linux executable from
//! PVH module 0 with all its memory mapped up front, and serves its system calls until it
//! exits. No timer interrupts, no demand paging: on a host where every kernel instruction is
//! emulated (shared/notes/pvm.md) the kernel's job is to stay out of the way.

#![no_std]
#![no_main]
// Unsafe code lives in `arch` only (which allows it), behind safe functions.
#![deny(unsafe_code)]

extern crate alloc;

mod arch;
mod bootinfo;
mod clock;
mod console;
mod enclave;
mod fs;
mod job;
mod linux;
mod machine;
mod mm;
mod net;
mod process;
mod sched;
mod signal;
mod syscall;
mod trap;
mod vdso;
mod xpmem;

/// The command line (pure logic, in `lwk-core`).
use lwk_core::cmdline;

use bootinfo::BootInfo;
use cmdline::JobOptions;
use console::log;

/// Called by the boot code (`arch::boot`) on the boot stack, with paging on and interrupts off.
fn kernel_main(start_info: u64) -> ! {
    let boot_tsc = arch::cpu::read_tsc();
    arch::serial::init();
    arch::tables::init_boot_cpu();
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
    if !cmdline::started_by_clowder_vmm(boot.command_line()) {
        mm::clear_free_memory();
    }
    // xAPIC registers (no x2APIC, as under QEMU TCG) are memory above RAM: map them first.
    if let Some(page) = arch::apic::xapic_page_needing_a_mapping() {
        mm::map_device_page(page);
    }
    let boot_cpu_apic = arch::apic::init_local_apic();
    sched::set_apic_id(0, boot_cpu_apic);
    sched::mark_cpu_tables_ready();
    if verbose {
        log!("memory: {} MiB free", mm::pmem::total_free() >> 20);
        mm::pmem::for_each_free(|range| log!("  free {:#x}..{:#x}", range.start, range.end));
    }
    let fpu_method =
        arch::fpu::method_wanted(cmdline::value_of(boot.command_line(), "lwk.fpu"), cmdline::started_by_clowder_vmm(boot.command_line()));
    arch::cpu::enable_user_fpu(fpu_method != arch::fpu::Method::Fxsave);
    arch::fpu::init(fpu_method);
    // The block of thread and process ids clowderd gave this enclave (block 0 without one).
    if let Some(text) = cmdline::value_of(boot.command_line(), "lwk.id_block") {
        match cmdline::parse_number(text).and_then(lwk_core::ids::IdBlock::new) {
            Some(block) => sched::use_id_block(block),
            None => log!("lwk.id_block={text} is not a block (0 to {}): ids come from block 0", lwk_core::ids::BLOCKS - 1),
        }
    }
    // `lwk.fastcalls=off`: every system call takes the kernel path (the fast calls' reference).
    arch::fastcall::set_enabled(cmdline::value_of(boot.command_line(), "lwk.fastcalls") != Some("off"));
    arch::cpu::allow_user_time_stamp_counter();
    clock::init(boot_tsc, !cmdline::started_by_clowder_vmm(boot.command_line()));

    // After a PVH boot the other vCPUs wait for INIT/SIPI; they start now and join the
    // scheduler once the job is loaded.
    let cpus = cmdline::value_of(boot.command_line(), "clowder.cpus")
        .or_else(|| cmdline::value_of(boot.command_line(), "lwk.cpus"))
        .and_then(cmdline::parse_number)
        .unwrap_or(1);
    if arch::boot::other_cpus_wait_for_sipi() && boot_cpu_apic.is_some() && cpus > 1 {
        arch::boot::install_ap_trampoline();
        arch::apic::start_other_cpus(arch::boot::AP_TRAMPOLINE >> 12, clock::delay_us);
    }

    // Test hook for containment tests: the kernel fails on purpose, the way asked.
    match cmdline::value_of(boot.command_line(), "lwk.crash") {
        Some("panic") => panic!("lwk.crash=panic asked for a kernel panic"),
        Some("fault") => arch::cpu::fault_on_purpose(),
        _ => {}
    }

    // No job module but a channel: a persistent enclave, whose jobs come from clowderd.
    if boot.modules().is_empty() {
        if let Some(channel) = enclave::ChannelConfig::from_command_line(boot.command_line()) {
            enclave::run(channel, cpus.min(arch::tables::MAX_CPUS as u64) as u16)
        }
    }
    let options = JobOptions::parse(boot.command_line()).unwrap_or_else(|error| panic!("bad option {}", error.0));
    match job::load(boot.modules().first(), &options, 0, 0) {
        Ok(frame) => {
            sched::wait_for_cpus(cpus.min(arch::tables::MAX_CPUS as u64) as u32);
            arch::trap::enter_user(&frame)
        }
        // Not the kernel's failure: the job cannot start here (a shell's status for a command
        // it cannot execute); the console line says why, for clowderd to report.
        Err(error) => {
            log!("cannot start the job: {error}");
            machine::exit(error.status())
        }
    }
}

/// Every other vCPU of a 64-bit direct start arrives here (RDI = its index) on its own stack,
/// while CPU 0 boots (`arch::boot`); it loads its tables and joins the scheduler once the job
/// is loaded.
fn ap_main(cpu: u64) -> ! {
    // The IDT is CPU 0's to fill; wait for it.
    while !sched::cpu_tables_ready() {
        core::hint::spin_loop();
    }
    arch::tables::init_cpu(cpu as usize, 0);
    sched::set_apic_id(cpu as usize, arch::apic::init_local_apic());
    arch::cpu::enable_user_fpu(arch::fpu::uses_xsave());
    arch::cpu::allow_user_time_stamp_counter();
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
