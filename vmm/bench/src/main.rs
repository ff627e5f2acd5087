//! `vmm-bench`: clowder-vmm's figures beside the anchors, medians of repeated runs measured
//! side by side in one run. Prints a table and writes docs/results/vmm-bench.md.
//!
//! RUNS (default 25) sets the repetitions; OUT sets the results file.

mod measure;
mod slots;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_ioctls::{Kvm, VcpuExit};
use linux_loader::loader::{Elf, KernelLoader};
use measure::{median, monotonic_ns};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::arch::{gdt, layout, paging, regs};
use vmm::{Device, DeviceError, ExitContext, ExtraDevice, HookKey, Outcome, Request, Vm, VmConfig};

const GUEST_READY: &str = concat!(env!("OUT_DIR"), "/ready.elf");
const GUEST_EXITLOOP: &str = concat!(env!("OUT_DIR"), "/exitloop.elf");
const GUEST_IDLE: &str = concat!(env!("OUT_DIR"), "/idle.elf");
const EXITLOOP_EXITS: u64 = 20_000;
const EXITLOOP_PORT: u16 = 0x90;

/// What the figures mean, appended to the results file.
const NOTES: &str = "\
## Notes

- **Boot**: the time to the first guest instruction is dominated by preallocating and populating
  guest RAM before the guest starts (a design choice: no page faults once it runs). On this
  nested host a 4 KiB page costs about 1.2 µs to populate, so 64 MiB takes ~16 ms; 2 MiB
  hugetlb backing needs 32 faults instead of 16,384 and meets the 10 ms target at 64 MiB.
  The guests here run a few instructions; a Linux guest's boot is another matter on PVM
  (docs/linux-guest.md).
- **Memory**: guest RAM is a shared memfd, counted as `RssShmem`; the figure is `VmRSS` minus
  that: the VMM's own code, heap and stacks.
- **Exits**: one port exit costs ~10 µs on PVM whatever the VMM does. The raw baseline is a bare
  `KVM_RUN` loop over the same guest image; the VMM adds its hook-registry dispatch, device lock,
  exit counters and run-state checks. Each pair is run back to back and the overhead is the
  median of the pair ratios.
- **Channel**: polled round trips use the test guest's echo loop running in ring 3, which PVM
  runs natively (ring-0 code is emulated at ~0.26 µs per instruction, so a ring-0 poller costs
  milliseconds). The p99 reflects descheduling on this shared 2-CPU machine. The doorbell row
  has both sides asleep: an irqfd interrupt into a halted guest, emulated guest kernel code to
  take it, and an ioeventfd back.
- **Memory slots**: XEMEM's PCI device maps an attachment's pages, however scattered, as one KVM
  memory slot (`GuestMemory::add_pieces`: one reserved host range, a fixed mapping per piece, one
  slot update). A slot per page costs a host mapping and a KVM slot update each, and KVM has
  32764 slots, so it is measured over 4096 pages and scaled. Every page of the one slot is read
  back through the VMM's view to check it is the right one. Here no two pages are neighbours in
  the file, so every page costs a mapping of its own (about 5 µs); a VM's real attachments come
  in runs of many pages (a GiB of a Linux VM's memory in 1057 runs, docs/results/xemem-attach.md),
  and attach at hundreds of GB/s.
";

fn vmm_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let sibling = exe.parent().unwrap().join("clowder-vmm");
    assert!(sibling.exists(), "{} is missing: build the workspace first (make build)", sibling.display());
    sibling
}

/// Process start → first guest exit and → "ready", in microseconds, for a VM of `mem` bytes
/// backed by `backing` pages (all of it populated before the guest starts).
fn boot_times(vmm: &Path, runs: usize, mem: &str, backing: &str) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut first, mut ready, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let t0 = monotonic_ns();
        let out = Command::new(vmm)
            .args(["--kernel", GUEST_READY, "--mem", mem, "--backing", backing, "--cpus", "1", "--serial", "null"])
            .env("CLOWDER_VMM_TIMING", "1")
            .output()
            .expect("clowder-vmm runs");
        let t_end = monotonic_ns();
        assert!(out.status.success(), "boot run failed: {}", String::from_utf8_lossy(&out.stderr));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let field = |name: &str| -> u128 {
            let start = stderr.find(name).unwrap_or_else(|| panic!("no {name} in {stderr}")) + name.len();
            stderr[start..].split_whitespace().next().unwrap().parse().unwrap()
        };
        first.push((field("first_exit_ns=") - t0) as f64 / 1000.0);
        ready.push((field("ready_ns=") - t0) as f64 / 1000.0);
        total.push((t_end - t0) as f64 / 1000.0);
    }
    (first, ready, total)
}

fn status_kib(pid: u32, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} missing"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resident memory of the VMM beyond guest RAM (which is a shared memfd: RssShmem), in MiB.
fn vmm_overhead_mib(vmm: &Path, runs: usize) -> (Vec<f64>, f64) {
    let mut overhead = Vec::new();
    let mut guest = 0.0;
    for _ in 0..runs {
        let mut child = Command::new(vmm)
            .args(["--kernel", GUEST_IDLE, "--mem", "128M", "--cpus", "1", "--serial", "null"])
            .stdout(Stdio::null())
            .spawn()
            .expect("clowder-vmm runs");
        std::thread::sleep(Duration::from_millis(150));
        let pid = child.id();
        let rss = status_kib(pid, "VmRSS:");
        let shmem = status_kib(pid, "RssShmem:");
        guest = shmem / 1024.0;
        overhead.push((rss - shmem) / 1024.0);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(143), "SIGTERM teardown");
    }
    (overhead, guest)
}

struct CountingPort(Arc<AtomicU64>);

impl Device for CountingPort {
    fn handle(&mut self, _: &ExitContext, _: Request<'_>) -> Result<Outcome, DeviceError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::Continue)
    }
}

/// Nanoseconds per exit through the VMM's hook registry.
fn exit_via_registry() -> f64 {
    let args: Vec<String> =
        ["--kernel", GUEST_EXITLOOP, "--mem", "16M", "--cpus", "1", "--serial", "null"].iter().map(|s| s.to_string()).collect();
    let config = VmConfig::from_args(&args).expect("valid config");
    let count = Arc::new(AtomicU64::new(0));
    let device = ExtraDevice {
        name: "bench-port".into(),
        keys: vec![HookKey::Port { base: EXITLOOP_PORT, len: 1 }],
        device: Arc::new(Mutex::new(CountingPort(count.clone()))),
    };
    let mut vm = Vm::with_devices(config, vec![device]).expect("VM builds");
    let t0 = Instant::now();
    vm.start().unwrap();
    let reason = vm.wait();
    let elapsed = t0.elapsed();
    assert_eq!(reason, vmm::StopReason::GuestExit(0));
    assert_eq!(count.load(Ordering::Relaxed), EXITLOOP_EXITS);
    elapsed.as_nanos() as f64 / EXITLOOP_EXITS as f64
}

/// Nanoseconds per exit for the same guest under a bare KVM_RUN loop that only matches the port.
fn exit_raw_kvm_loop() -> f64 {
    let kvm = Kvm::new().unwrap();
    let vm = kvm.create_vm().unwrap();
    vm.set_tss_address(0xfffb_d000).unwrap();
    vm.create_irq_chip().unwrap();
    let size = 16 << 20;
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).unwrap();
    use vm_memory::GuestMemoryBackend;
    let host = mem.get_host_address(GuestAddress(0)).unwrap();
    let region = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: size as u64,
        userspace_addr: host as u64,
    };
    // SAFETY: `mem` outlives the VM in this function.
    unsafe { vm.set_user_memory_region(region).unwrap() };
    let mut image = std::fs::File::open(GUEST_EXITLOOP).unwrap();
    let loaded = Elf::load(&mem, None, &mut image, Some(GuestAddress(layout::HIGH_MEMORY_START))).unwrap();
    for (gpa, page) in paging::identity_tables() {
        mem.write_slice(&page, GuestAddress(gpa)).unwrap();
    }
    let gdt_bytes: Vec<u8> = gdt::boot_gdt().iter().flat_map(|d| d.to_le_bytes()).collect();
    mem.write_slice(&gdt_bytes, GuestAddress(layout::GDT_ADDR)).unwrap();
    let mut vcpu = vm.create_vcpu(0).unwrap();
    vcpu.set_cpuid2(&kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap()).unwrap();
    let mode = regs::StartMode::Long64 { entry: loaded.kernel_load.0, vcpu_index: 0 };
    vcpu.set_sregs(&regs::special_registers(vcpu.get_sregs().unwrap(), mode)).unwrap();
    vcpu.set_regs(&regs::general_registers(mode)).unwrap();
    let mut exits = 0u64;
    let t0 = Instant::now();
    loop {
        match vcpu.run().unwrap() {
            VcpuExit::IoOut(EXITLOOP_PORT, _) => exits += 1,
            VcpuExit::IoOut(0xf4, _) => break,
            other => panic!("unexpected exit {other:?}"),
        }
    }
    let elapsed = t0.elapsed();
    assert_eq!(exits, EXITLOOP_EXITS);
    elapsed.as_nanos() as f64 / EXITLOOP_EXITS as f64
}

/// The test guest image (`make kernels` builds it).
fn testguest() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/target/x86_64-unknown-none/release/testguest");
    assert!(path.exists(), "{} is missing: run make kernels", path.display());
    path
}

fn report_key(name: &str) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    u64::from_le_bytes(bytes)
}

/// Round trips through the enclave channel to the test guest's echo server, in nanoseconds each.
/// Polling: both sides spin, the guest in a ring-3 loop.
/// `sleeping`: both sides sleep between messages (guest: `hlt` until the channel vector;
/// host: poll() on the doorbell eventfd), so every message costs a doorbell each way.
fn channel_round_trips(sleeping: bool, messages: usize) -> Vec<f64> {
    // Polling: the guest's echo loop runs in ring 3, natively (ring-0 code is emulated on PVM).
    let mode = if sleeping { "doorbell" } else { "poll-user" };
    let guest = testguest();
    let args: Vec<String> = ["--mem", "64M", "--cpus", "1", "--serial", "null", "--cmdline"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("test=channel mode={mode}"), "--kernel".into(), guest.display().to_string()])
        .collect();
    let mut vm = Vm::new(VmConfig::from_args(&args).expect("valid config")).expect("VM builds");
    vm.start().unwrap();
    let handle = vm.handle();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !handle.reports().iter().any(|r| r.key == report_key("chready")) {
        assert!(Instant::now() < deadline, "the guest's echo server did not come up");
        std::thread::sleep(Duration::from_millis(1));
    }
    let device = handle.channel().expect("channel device");
    let mut host = device.channel().host_end().expect("channel counters");
    let mut reply = [0u8; 256];
    let mut samples = Vec::with_capacity(messages);
    let mut exchange = |message: &[u8], samples: Option<&mut Vec<f64>>| {
        let t0 = Instant::now();
        host.send(message).expect("ring has room");
        if host.peer_waiting() {
            device.ring_guest().unwrap();
        }
        loop {
            if let Some(n) = host.recv(&mut reply).expect("well-formed ring") {
                assert_eq!(&reply[..n], if message == b"quit" { &b"bye"[..] } else { message });
                break;
            }
            if sleeping {
                host.set_waiting(true);
                if !host.has_message().unwrap() {
                    let mut fd = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&device.doorbell), events: libc::POLLIN, revents: 0 };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut fd, 1, 1000) };
                    let _ = device.doorbell.read();
                }
                host.set_waiting(false);
            } else {
                std::hint::spin_loop();
            }
        }
        if let Some(samples) = samples {
            samples.push(t0.elapsed().as_nanos() as f64);
        }
    };
    for i in 0..messages {
        let message = format!("message {i:08}");
        exchange(message.as_bytes(), Some(&mut samples));
    }
    exchange(b"quit", None);
    assert_eq!(vm.wait(), vmm::StopReason::GuestExit(0));
    samples
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[((values.len() - 1) as f64 * p).round() as usize]
}

fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap().trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    format!(
        "{cpu}, {} CPUs, Linux {}, KVM backend: {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        kernel.trim(),
        if pvm { "PVM (guest kernel mode emulated)" } else { "hardware virtualization" }
    )
}

fn main() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(25);
    let vmm = vmm_binary();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();

    // Quick partial runs while tuning: CHANNEL_ONLY=1, EXITS_ONLY=1 (or =raw / =hooked alone).
    if std::env::var_os("CHANNEL_ONLY").is_some() {
        let (mut polled, mut doorbell) = (channel_round_trips(false, 2000), channel_round_trips(true, 500));
        println!("polled {:.2} us, doorbell {:.2} us", median(&mut polled) / 1000.0, median(&mut doorbell) / 1000.0);
        return;
    }
    if std::env::var_os("EXITS_ONLY").is_some() {
        let (mut raw, mut hooked, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        let only = std::env::var("EXITS_ONLY").unwrap_or_default();
        for _ in 0..runs {
            let r = if only == "hooked" { 1.0 } else { exit_raw_kvm_loop() };
            let h = if only == "raw" { 1.0 } else { exit_via_registry() };
            raw.push(r);
            hooked.push(h);
            ratio.push(h / r);
        }
        println!("raw {:.0} ns, hooked {:.0} ns, median pair ratio {:.3}", median(&mut raw), median(&mut hooked), median(&mut ratio));
        return;
    }
    eprintln!("boot time ({runs} runs per memory size)...");
    let free_hugepages: u64 = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let mut boot_rows = Vec::new();
    for (mem, backing) in [("16M", "4k"), ("64M", "4k"), ("64M", "2m")] {
        if backing == "2m" && free_hugepages < 32 {
            eprintln!("skipping the 2m boot row: reserve 32 hugepages (sysctl vm.nr_hugepages=32)");
            continue;
        }
        let (mut first, mut ready, mut total) = boot_times(&vmm, runs, mem, backing);
        boot_rows.push((mem, backing, median(&mut first), median(&mut ready), median(&mut total)));
    }
    eprintln!("VMM resident memory ({runs} runs)...");
    let (mut overhead, guest_mib) = vmm_overhead_mib(&vmm, runs);
    eprintln!("exit round trip ({runs} runs each, alternating)...");
    // Each pair is measured back to back, so a ratio within a pair cancels the machine's load of
    // the moment; the median of those ratios is the overhead figure.
    let (mut raw, mut hooked, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (r, h) = (exit_raw_kvm_loop(), exit_via_registry());
        raw.push(r);
        hooked.push(h);
        ratios.push(h / r);
    }
    let overhead = median(&mut overhead);
    let (raw, hooked) = (median(&mut raw), median(&mut hooked));
    eprintln!("channel round trips (polled, then doorbell)...");
    let mut polled = channel_round_trips(false, 2000);
    let mut doorbell = channel_round_trips(true, 500);
    let added = (median(&mut ratios) - 1.0) * 100.0;
    eprintln!("an attachment's memory slots ({runs} runs)...");
    let slot_times = slots::slot_times(runs);
    let slot_median = |pick: fn(&slots::SlotTimes) -> f64| median(&mut slot_times.iter().map(pick).collect::<Vec<_>>());
    let (one_slot_add, one_slot_remove, slot_per_page_add) =
        (slot_median(|t| t.one_slot_add), slot_median(|t| t.one_slot_remove), slot_median(|t| t.slot_per_page_add));
    let attachment_gb = (slots::PAGES * 4096) as f64 / 1e9;

    let mut rows = Vec::new();
    for (mem, backing, first, ready, total) in boot_rows {
        rows.push((
            format!("{mem} {backing}: process start → first guest instruction (its first exit)"),
            format!("{:.2} ms", first / 1000.0),
            "≤ 10 ms (Firecracker: ≤ 125 ms to Linux init)".to_string(),
        ));
        rows.push((
            format!("{mem} {backing}: process start → guest \"ready\" hypercall"),
            format!("{:.2} ms", ready / 1000.0),
            "Firecracker: ≤ 125 ms to /sbin/init".to_string(),
        ));
        rows.push((
            format!("{mem} {backing}: process start → VMM exited (whole run, with teardown)"),
            format!("{:.2} ms", total / 1000.0),
            "-".to_string(),
        ));
    }
    rows.extend([
        (
            "VMM resident memory beyond guest RAM".to_string(),
            format!("{overhead:.2} MiB (guest RAM resident: {guest_mib:.0} MiB)"),
            "≤ 5 MiB (Firecracker)".to_string(),
        ),
        ("port exit, raw KVM_RUN loop".to_string(), format!("{:.2} µs", raw / 1000.0), "baseline".to_string()),
        (
            "port exit through the hook registry".to_string(),
            format!("{:.2} µs ({added:+.1}%, median of pair ratios)", hooked / 1000.0),
            "≤ 5% added".to_string(),
        ),
        (
            "channel round trip, both sides polling, guest loop in ring 3 (2000 messages)".to_string(),
            format!("median {:.2} µs, p99 {:.2} µs", median(&mut polled) / 1000.0, percentile(&mut polled, 0.99) / 1000.0),
            "≤ 2 µs".to_string(),
        ),
        (
            "channel round trip, both sides sleeping: doorbell each way (500 messages)".to_string(),
            format!("median {:.2} µs, p99 {:.2} µs", median(&mut doorbell) / 1000.0, percentile(&mut doorbell, 0.99) / 1000.0),
            "-".to_string(),
        ),
        (
            format!(
                "an attachment of {} scattered 4 KiB pages (128 MiB, each page its own piece: the worst case) into a VM as one memory \
                 slot: add / remove",
                slots::PAGES
            ),
            format!("{one_slot_add:.1} ms ({:.2} GB/s) / {one_slot_remove:.1} ms", attachment_gb / one_slot_add * 1e3),
            "XEMEM paper, Palacios: 1 GB into a Linux VM at 3.99 GB/s, 8.79 GB/s without its red-black tree of regions".to_string(),
        ),
        (
            "the same attachment as a memory slot per page (4096 added, scaled)".to_string(),
            format!("{slot_per_page_add:.1} ms ({:.2} GB/s)", attachment_gb / slot_per_page_add * 1e3),
            "-".to_string(),
        ),
    ]);
    let mut table = String::from("| measurement | clowder | anchor |\n|---|---|---|\n");
    for (what, ours, anchor) in &rows {
        table.push_str(&format!("| {what} | {ours} | {anchor} |\n"));
    }
    println!("{table}");
    let report = format!(
        "# clowder-vmm benchmarks\n\n{date}; {}.\nMedians of {runs} runs, measured side by side in one run of `make bench` (`target/release/vmm-bench`).\n\n{table}\n{NOTES}",
        machine_description()
    );
    let out = std::env::var("OUT").unwrap_or_else(|_| "docs/results/vmm-bench.md".into());
    if let Err(e) = std::fs::write(&out, report) {
        eprintln!("vmm-bench: cannot write {out}: {e}");
    } else {
        eprintln!("wrote {out}");
    }
}
