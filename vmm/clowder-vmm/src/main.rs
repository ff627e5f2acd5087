//! `clowder-vmm`: runs one virtual machine (one process per VM). Configured by a TOML file and/or
//! flags (`--help`); the exit status is the guest's own, or a fixed code per failure kind
//! (README, "Exit status"). SIGTERM and SIGINT tear the VM down cleanly. Diagnostics as
//! CLOWDER_LOG says (default info; crates/log); configuration errors are plain stderr lines.

use std::process::ExitCode;

use clowder_sys::TerminationSignals;
use vmm::{StopReason, Vm, VmConfig};

/// Status for a configuration or setup error, before the guest ran.
const EXIT_SETUP: u8 = 2;

/// `CLOWDER_VMM_PARENT=PID`: the process (a node daemon) whose end must end this VM too, so
/// that a daemon that dies, even by SIGKILL, leaves no machine running for nobody. Only the
/// current parent counts: a wrong PID is ignored.
fn parent_to_follow() -> Option<u32> {
    let pid: u32 = std::env::var("CLOWDER_VMM_PARENT").ok()?.parse().ok()?;
    (std::os::unix::process::parent_id() == pid).then_some(pid)
}

/// Stops the VM once this process is no longer `parent`'s child (the parent ended and the
/// process was handed to a reaper).
fn stop_when_orphaned(parent: u32, handle: &vmm::VmHandle) {
    while std::os::unix::process::parent_id() == parent {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Stop first: the parent often held our stderr, and writing to a closed pipe fails (which
    // the logger ignores).
    handle.stop();
    log::warn!("parent process {parent} ended; stopping the VM");
}

/// `CLOWDER_VMM_XEMEM_PCI=PATH`: give the guest the XEMEM PCI device, its mailbox answered by
/// the node daemon that connects to PATH (docs/xemem-pci.md). Set by clowderd for Linux
/// enclaves.
fn xemem_device() -> Result<Vec<vmm::ExtraDevice>, String> {
    let Some(path) = std::env::var_os("CLOWDER_VMM_XEMEM_PCI").filter(|p| !p.is_empty()) else { return Ok(Vec::new()) };
    let host = vmm::pci::link::RemoteHost::listen(std::path::Path::new(&path))
        .map_err(|e| format!("XEMEM mailbox socket {}: {e}", std::path::Path::new(&path).display()))?;
    vmm::pci::xemem_devices(Box::new(host)).map_err(|e| format!("XEMEM device: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--version" || arg == "-V") {
        println!("clowder-vmm {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    if let Err(e) = clowder_log::init("clowder-vmm", clowder_log::LevelFilter::Info) {
        eprintln!("clowder-vmm: {e}");
        return ExitCode::from(EXIT_SETUP);
    }
    let config = match VmConfig::from_args(&args) {
        Ok(c) => c,
        Err(e) if e.is_help_request() => {
            print!("{}", vmm_config::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("clowder-vmm: {e}");
            return ExitCode::from(EXIT_SETUP);
        }
    };
    let cores: Vec<String> =
        config.vcpus.iter().map(|vcpu| vcpu.host_core.map_or_else(|| "unpinned".into(), |core| core.to_string())).collect();
    log::debug!(
        "{} vCPU(s) (host core of each: {}), {} MiB of guest RAM on {:?}",
        cores.len(),
        cores.join(","),
        config.memory.size >> 20,
        config.memory.backing
    );
    // Every thread inherits the mask, so only the waiter below ever sees these signals.
    let termination = TerminationSignals::block();
    let control_socket = config.control_socket.clone();
    let extra = match xemem_device() {
        Ok(extra) => extra,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::from(EXIT_SETUP);
        }
    };
    let mut vm = match Vm::with_devices(config, extra) {
        Ok(vm) => vm,
        Err(e) => {
            log::error!("cannot create the VM: {e}");
            return ExitCode::from(EXIT_SETUP);
        }
    };
    let handle = vm.handle();
    if let Some(path) = &control_socket {
        if let Err(e) = vmm::control::serve(handle.clone(), path) {
            log::error!("control socket {}: {e}", path.display());
            return ExitCode::from(EXIT_SETUP);
        }
    }
    let signalled = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    {
        let handle = handle.clone();
        let signalled = signalled.clone();
        std::thread::spawn(move || {
            if let Some(signal) = termination.wait() {
                signalled.store(signal, std::sync::atomic::Ordering::SeqCst);
                handle.stop();
            }
        });
    }
    if let Some(parent) = parent_to_follow() {
        let handle = handle.clone();
        std::thread::spawn(move || stop_when_orphaned(parent, &handle));
    }
    if let Err(e) = vm.start() {
        log::error!("cannot start the VM: {e}");
        return ExitCode::from(EXIT_SETUP);
    }
    let reason = vm.wait();
    if std::env::var_os("CLOWDER_VMM_TIMING").is_some() {
        print_timing(&handle);
    }
    if let Some(path) = &control_socket {
        let _ = std::fs::remove_file(path);
    }
    let signal = signalled.load(std::sync::atomic::Ordering::SeqCst);
    if signal != 0 && reason == StopReason::Requested {
        log::info!("stopped by signal {signal}; VM torn down");
        return ExitCode::from(128 + signal as u8);
    }
    if reason.is_failure() {
        log::error!("{reason}");
        for (vcpu, registers) in handle.shared.watchdog_registers() {
            log::error!("vCPU {vcpu}: {registers}");
        }
    }
    ExitCode::from(reason.exit_code() as u8)
}

/// Prints when the guest first exited and when it signalled "ready", as CLOCK_MONOTONIC
/// nanoseconds, so a benchmark that timed the process start can subtract.
fn print_timing(handle: &vmm::VmHandle) {
    let now_instant = std::time::Instant::now();
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes into the timespec above.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let now_ns = now.tv_sec as u128 * 1_000_000_000 + now.tv_nsec as u128;
    let monotonic = |at: Option<std::time::Instant>| {
        at.map(|t| (now_ns - now_instant.duration_since(t).as_nanos()).to_string()).unwrap_or_else(|| "none".into())
    };
    let events = handle.shared.events.lock().unwrap();
    eprintln!("clowder-vmm timing: first_exit_ns={} ready_ns={}", monotonic(events.first_exit_at), monotonic(events.ready_at));
}
