//! Booting the test guest: PVH and 64-bit direct entry, the start info and memory map it finds,
//! SMP start (direct and INIT/SIPI), serial, exit status, and the ways a guest can end badly
//! (triple fault, hang, unclaimed port). See `kernels/testguest/README.md` for the reports.

#[macro_use]
mod guest_support;

use std::collections::BTreeSet;

use guest_support::{run, Guest, GuestSpec, Scratch, GUEST_TIMEOUT};
use vmm::arch::memmap::GuestLayout;
use vmm::StopReason;

const START_INFO_MAGIC: u64 = 0x336e_c578;

#[test]
fn pvh_entry_finds_start_info_memory_map_cmdline_and_modules() {
    require_kvm!();
    let scratch = Scratch::new("module");
    let module_path = scratch.path().join("module.bin");
    let module_bytes: Vec<u8> = b"MODULE01".iter().copied().chain((0..5000u32).map(|i| i as u8)).collect();
    std::fs::write(&module_path, &module_bytes).unwrap();

    let guest = Guest::start(GuestSpec::new("test=pvh marker=xyz").protocol("pvh").module(module_path));
    let layout: GuestLayout = guest.handle.layout();
    let channel_gpa = guest.handle.channel().expect("a channel device").gpa;
    let done = guest.finish();
    done.assert_exit(0);

    assert_eq!(done.value("bootpath"), 1, "entered through the PVH note\n{done}");
    assert_eq!(done.value("magic"), START_INFO_MAGIC);
    assert_eq!(done.value("version"), 1);
    assert_eq!(done.value("nr_mods"), 1);

    // The memory map the guest read is the one the VMM's layout describes.
    let expected: Vec<(u64, u64, u64)> = layout.memory_map().iter().map(|e| (e.addr, e.size, e.kind as u64)).collect();
    let found: Vec<(u64, u64, u64)> = done
        .values("mm_addr")
        .into_iter()
        .zip(done.values("mm_size"))
        .zip(done.values("mm_type"))
        .map(|((addr, size), kind)| (addr, size, kind))
        .collect();
    assert_eq!(done.value("memmap") as usize, found.len());
    assert_eq!(found, expected, "{done}");
    assert_eq!(found[0], (0, 0x9fc00, 1), "low RAM first");
    assert!(
        found.iter().any(|&(addr, size, kind)| addr == channel_gpa && size == 0x10000 && kind == 2),
        "the channel is reserved in the memory map\n{done}"
    );

    // The module is listed, and its bytes are in guest memory where the list says.
    assert_eq!(done.value("mod_size"), module_bytes.len() as u64);
    assert_eq!(done.value("mod_head"), u64::from_le_bytes(*b"MODULE01"));
    assert_eq!(done.value("mod_addr") % 4096, 0, "modules are page aligned");

    // The command line is ours plus the VMM's clowder.* keys.
    let cmdline_line = done.serial.lines().find(|l| l.starts_with("pvh: cmdline '")).expect("cmdline line");
    let cmdline = cmdline_line.trim_start_matches("pvh: cmdline '").trim_end_matches('\'');
    assert!(cmdline.starts_with("test=pvh marker=xyz"), "{cmdline}");
    for key in ["clowder.channel=", "clowder.hypercall_port=", "clowder.exit_port=", "clowder.cpus=1", "clowder.ram_page=0x1000"] {
        assert!(cmdline.contains(key), "{key} missing from {cmdline}");
    }
    assert_eq!(done.value("cmdlen"), cmdline.len() as u64);
    assert!(done.serial.contains("pvh: 1 modules") || done.serial.contains("memmap entries, 1 modules"), "{done}");
}

#[test]
fn direct64_entry_gets_start_info_in_rsi() {
    require_kvm!();
    let done = run(GuestSpec::new("test=pvh").protocol("direct64"));
    done.assert_exit(0);
    assert_eq!(done.value("bootpath"), 0, "entered at the ELF entry in 64-bit mode\n{done}");
    assert_eq!(done.value("magic"), START_INFO_MAGIC);
    assert!(done.serial.contains("testguest: test=pvh vcpu=0 boot=direct64"), "{done}");
}

#[test]
fn serial_lines_reach_the_output_in_order() {
    require_kvm!();
    let done = run(GuestSpec::new("test=serial lines=5"));
    done.assert_exit(0);
    let expected: Vec<String> = std::iter::once("testguest: test=serial vcpu=0 boot=pvh".to_string())
        .chain((1..=5).map(|i| format!("serial: line {i} of 5")))
        .chain(std::iter::once("serial: done".to_string()))
        .collect();
    let lines: Vec<&str> = done.serial.lines().collect();
    assert_eq!(lines, expected, "{done}");
}

#[test]
fn exit_port_status_becomes_the_stop_reason() {
    require_kvm!();
    for status in [0u8, 42, 255] {
        let done = run(GuestSpec::new(&format!("test=exit status={status}")));
        done.assert_exit(status);
        assert_eq!(done.stop.exit_code(), i32::from(status));
    }
}

#[test]
fn a_vm_paused_before_start_runs_nothing_until_resumed() {
    require_kvm!();
    let scratch = Scratch::new("paused");
    let mut vm = vmm::Vm::new(GuestSpec::new("test=exit status=7").config(&scratch)).unwrap();
    let handle = vm.handle();
    handle.pause().expect("a created VM can be paused");
    vm.start().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(handle.state(), vmm::RunState::Paused);
    assert!(handle.exit_counters().iter().all(|(_, n)| *n == 0), "no guest code ran while paused");
    handle.resume().unwrap();
    assert_eq!(vm.wait_timeout(GUEST_TIMEOUT), Some(vmm::StopReason::GuestExit(7)));
}

#[test]
fn a_finished_vm_can_be_stopped_and_dropped_again() {
    require_kvm!();
    // Kicking vCPU threads that have ended used to signal dead threads and write into their
    // unmapped kvm_run pages.
    let scratch = Scratch::new("finished");
    let mut vm = vmm::Vm::new(GuestSpec::new("test=exit status=3").cpus(2).config(&scratch)).unwrap();
    let handle = vm.handle();
    vm.start().unwrap();
    assert_eq!(vm.wait_timeout(GUEST_TIMEOUT), Some(StopReason::GuestExit(3)));
    for _ in 0..100 {
        handle.stop();
        assert!(handle.pause().is_err());
    }
    drop(vm);
    handle.stop();
}

#[test]
fn instruction_profile_single_steps_a_running_guest() {
    require_kvm!();
    let guest = Guest::start(GuestSpec::new("test=nop-loop count=100000"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let profile = guest.handle.profile_instructions(0, 3000, GUEST_TIMEOUT).expect("profile completes");
    // The test guest runs only in ring 0 and never returns to user mode.
    assert_eq!((profile.steps, profile.kernel, profile.user, profile.kernel_entries), (3000, 3000, 0, 0));
    assert!(guest.handle.profile_instructions(5, 10, GUEST_TIMEOUT).is_err(), "no vCPU 5");
    assert!(guest.handle.profile_instructions(0, 0, GUEST_TIMEOUT).is_err(), "zero steps");
    guest.handle.stop();
    guest.finish();
}

#[test]
fn unknown_test_exits_with_bad_cmdline_status() {
    require_kvm!();
    run(GuestSpec::new("test=no-such-test")).assert_exit(2);
    run(GuestSpec::new("nothing=here")).assert_exit(2);
}

/// (cpu number, LAPIC id) pairs the guest reported, one per vCPU. Reports of different vCPUs
/// interleave, so they are grouped by the vCPU the VMM saw each one come from.
fn processors(done: &guest_support::Finished) -> BTreeSet<(u64, u64)> {
    let vcpus: BTreeSet<usize> = done.reports.iter().map(|r| r.vcpu).collect();
    vcpus
        .into_iter()
        .filter_map(|vcpu| {
            let value_of = |key: &str| {
                let values: Vec<u64> =
                    done.reports.iter().filter(|r| r.vcpu == vcpu && r.key == guest_support::pack_key(key)).map(|r| r.value).collect();
                assert!(values.len() <= 1, "vCPU {vcpu} reported {key} {} times\n{done}", values.len());
                values.first().copied()
            };
            let cpu = value_of("cpu")?;
            let apic_id = value_of("apicid").expect("apicid with cpu");
            assert_eq!(value_of("cpuidapc"), Some(apic_id), "LAPIC and CPUID agree on vCPU {vcpu}\n{done}");
            Some((cpu, apic_id))
        })
        .collect()
}

#[test]
fn smp_direct_start_enters_every_vcpu_with_its_index() {
    require_kvm!();
    let online = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // vCPU i pinned to the last core minus i (reversed, so an identity mapping cannot pass by luck).
    let cores: Vec<usize> = (0..2).map(|i| online.saturating_sub(1 + i)).collect();
    let done = run(GuestSpec::new("test=smp").protocol("direct64").cpus(2).cores(&cores));
    done.assert_exit(0);
    assert_eq!(done.value("arrived"), 2, "{done}");
    // Each vCPU reported its own RDI index, from its own vCPU thread, with APIC id = index.
    // and from the host core its thread is pinned to.
    for report in done.reports.iter().filter(|r| r.key == guest_support::pack_key("cpu")) {
        assert_eq!(report.value, report.vcpu as u64, "{done}");
        assert_eq!(report.host_core, Some(cores[report.vcpu]), "vCPU {} on its core: {done}", report.vcpu);
    }
    assert_eq!(processors(&done), BTreeSet::from([(0, 0), (1, 1)]), "{done}");
}

#[test]
fn sipi_guest_starts_application_processors_from_direct64() {
    require_kvm!();
    let done = run(GuestSpec::new("test=sipi").protocol("direct64").smp("sipi").cpus(2));
    done.assert_exit(0);
    assert_eq!(done.value("arrived"), 2, "{done}");
    assert_eq!(processors(&done), BTreeSet::from([(0, 0), (1, 1)]), "{done}");
    assert!(done.serial.contains("sipi: cpu 1 apic id 1"), "{done}");
}

#[test]
fn sipi_guest_starts_application_processors_from_pvh() {
    require_kvm!();
    let done = run(GuestSpec::new("test=sipi").protocol("pvh").cpus(3));
    done.assert_exit(0);
    assert_eq!(done.value("arrived"), 3, "{done}");
    let found = processors(&done);
    let apic_ids: BTreeSet<u64> = found.iter().map(|&(_, apic)| apic).collect();
    let cpus: BTreeSet<u64> = found.iter().map(|&(cpu, _)| cpu).collect();
    assert_eq!(apic_ids, BTreeSet::from([0, 1, 2]), "{done}");
    assert_eq!(cpus, BTreeSet::from([0, 1, 2]), "{done}");
}

#[test]
fn triple_fault_stops_the_vm_with_registers() {
    require_kvm!();
    let done = run(GuestSpec::new("test=triplefault"));
    match &done.stop {
        StopReason::TripleFault { vcpu: 0, regs } => {
            assert_eq!(regs.cs, 0x08, "faulted in the guest's 64-bit code segment");
            assert!(regs.rip >= 0x10_0000, "inside the image: {regs}");
        }
        other => panic!("expected a triple fault, got {other}\n{done}"),
    }
    assert_eq!(done.stop.exit_code(), 125);
    assert!(done.serial.contains("triplefault: now"));
}

#[test]
fn hung_guest_is_stopped_by_the_watchdog() {
    require_kvm!();
    let started = std::time::Instant::now();
    let done = run(GuestSpec::new("test=hang").watchdog("300ms"));
    assert!(matches!(done.stop, StopReason::Watchdog { silent_ms } if silent_ms >= 300), "{done}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(done.serial.contains("hang: halting with interrupts off"));
}

#[test]
fn write_to_an_unclaimed_port_is_an_unhandled_exit() {
    require_kvm!();
    let done = run(GuestSpec::new("test=badport port=0x999"));
    match &done.stop {
        StopReason::UnhandledExit { vcpu: 0, what, .. } => assert!(what.contains("0x999"), "{what}"),
        other => panic!("expected an unhandled exit, got {other}\n{done}"),
    }
    assert!(done.values("badin").is_empty(), "the guest never got past the write");
}

#[test]
fn ready_hypercall_is_timestamped() {
    require_kvm!();
    let guest = Guest::start(GuestSpec::new("test=ready"));
    let shared = guest.handle.shared.clone();
    let done = guest.finish();
    done.assert_exit(0);
    let events = shared.events.lock().unwrap();
    let ready_at = events.ready_at.expect("the ready hypercall was timestamped");
    let boot_time = ready_at - shared.created_at;
    eprintln!("ready {boot_time:?} after the VM was created");
    assert!(done.serial.is_empty(), "no banner in the boot-time benchmark: {:?}", done.serial);
}

#[test]
fn nop_loop_makes_that_many_hypercalls() {
    require_kvm!();
    const COUNT: u64 = 2000;
    let started = std::time::Instant::now();
    let done = run(GuestSpec::new(&format!("test=nop-loop count={COUNT}")));
    let elapsed = started.elapsed();
    done.assert_exit(0);
    assert_eq!(done.value("nops"), COUNT);
    // The nops, the report and nothing else went through the hypercall port.
    assert_eq!(done.exit_count("hypercall"), COUNT + 1, "{:?}", done.exit_counters);
    eprintln!("{COUNT} nop hypercalls: {:.1} us each (whole run)", elapsed.as_secs_f64() * 1e6 / COUNT as f64);
}

/// XRSTOR and XSAVE in guest kernel mode move the x87, SSE and AVX state (on PVM through the
/// VMM, whose emulator cannot: `vmm::emulate`), and a misaligned area gets #GP at the
/// instruction. Also times a pair, by the guest's TSC (KVM runs it at the host's rate).
#[test]
fn xsave_and_xrstor_in_guest_kernel_mode_keep_the_vector_state() {
    require_kvm!();
    const COUNT: u64 = 2000;
    let done = run(GuestSpec::new(&format!("test=xsave count={COUNT}")));
    if done.values("noavx") == [1] {
        eprintln!("skipped: the CPU offers no XSAVE or no AVX");
        return;
    }
    done.assert_exit(0xee);
    assert_eq!(done.value("kept"), 1, "{done}");
    assert_eq!(done.value("pairs"), COUNT);
    let expected = format!("testguest: exception 13 error 0x0 at rip {:#x}", done.value("gpat"));
    assert!(done.serial.contains(&expected), "expected '{expected}'\n{done}");
    if vmm::arch::cpuid::on_pvm() {
        // The first pair, COUNT pairs and the misaligned XRSTOR, each an emulation failure.
        assert_eq!(done.exit_count("emulated"), 2 * COUNT + 3, "{:?}", done.exit_counters);
    }
    let pair = done.value("cycles") as f64 / tsc_per_second() / COUNT as f64;
    eprintln!("XSAVE+XRSTOR in guest kernel mode: {:.1} us a pair", pair * 1e6);
}

/// The host's TSC rate, over 100 ms.
fn tsc_per_second() -> f64 {
    // SAFETY: RDTSC only reads the time-stamp counter.
    let tsc = || unsafe { std::arch::x86_64::_rdtsc() };
    let (started, first) = (std::time::Instant::now(), tsc());
    std::thread::sleep(std::time::Duration::from_millis(100));
    (tsc() - first) as f64 / started.elapsed().as_secs_f64()
}

#[test]
fn int3_in_guest_kernel_mode_raises_a_breakpoint_after_it() {
    require_kvm!();
    let done = run(GuestSpec::new("test=int3"));
    done.assert_exit(0xee);
    let site = done.value("int3at");
    let expected = format!("testguest: exception 3 error 0x0 at rip {:#x}", site + 1);
    assert!(done.serial.contains(&expected), "expected '{expected}'\n{done}");
}
