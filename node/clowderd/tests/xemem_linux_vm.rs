//! XEMEM in a Linux VM, end to end: a daemon with its broker boots a `--kind linux` enclave
//! (the project's small kernel and agent), whose VMM has the XEMEM PCI device. One static XPMEM
//! program, `xemem/tests/vm_exchange.c`, runs as a job in the VM and as a host process: each
//! makes a named segment, attaches the other's, checks every page and writes into it, and sees
//! the other's write in its own (host->VM and VM->host, checked by content), then signals and
//! revocation, a guest exporter that ends without removing, the exchange again with a second
//! VM's job in the host's place (VM<->VM, the two VMs booted in parallel) and with an LWK
//! enclave's job there. Opt-in (`make test-linux-xemem`): the boot is minutes of
//! emulated kernel code on a PVM host.
//! `CLOWDER_LINUX_KERNEL`/`CLOWDER_LINUX_INITRD` name a prebuilt guest; scripts/linux-kernel.sh
//! builds (or finds cached) both otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

mod support;
use support::{build_musl_job, call, job_test_dir, log_lines, lwk_job, run_job, run_job_to_end, start_daemon_with_broker, BrokeredDaemon};

/// The guest file `variable` names, else what scripts/linux-kernel.sh ARGS prints last.
fn guest_file(variable: &str, args: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(variable) {
        return path.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new(root.join("scripts/linux-kernel.sh")).args(args).output().unwrap();
    assert!(output.status.success(), "scripts/linux-kernel.sh {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default())
}

/// The guest's kernel and initramfs, found (or built) once: two builds at a time collide.
fn guest_files() -> (PathBuf, PathBuf) {
    (guest_file("CLOWDER_LINUX_KERNEL", &[]), guest_file("CLOWDER_LINUX_INITRD", &["initramfs"]))
}

/// Creates Linux enclave `name` of `mem` (on 2 MiB pages if `hugepages`) booting `guest`
/// ([`guest_files`]) under the daemon at `socket` and says how long it took to be ready.
fn create_linux_enclave(socket: &Path, name: &str, mem: &str, hugepages: bool, (kernel, initrd): &(PathBuf, PathBuf)) {
    let started = Instant::now();
    let created = call(
        socket,
        json!({"op": "create", "name": name, "kind": "linux", "cores": 1, "mem": mem, "hugepages": hugepages,
               "kernel": kernel.to_str().unwrap(), "initrd": initrd.to_str().unwrap()}),
    );
    assert_eq!(created["ok"], true, "{created}");
    eprintln!("{name}: create to ready: {:.0} s", started.elapsed().as_secs_f64());
}

#[test]
#[ignore = "boots a Linux guest: minutes on a PVM host (make test-linux-xemem)"]
fn one_xpmem_program_exchanges_memory_between_host_and_vm() {
    let Some(dir) = job_test_dir("clowder-xemem-linux-vm") else { return };
    let program = lwk_job(&dir.0, "vm_exchange");
    let daemon = start_daemon_with_broker(&dir.0);
    // CLOWDER_XEMEM_VM_BENCH: measure in the same VM afterwards (one boot instead of two).
    let bench = std::env::var_os("CLOWDER_XEMEM_VM_BENCH").is_some();
    // `vm2` is the other side of VM<->VM: booted beside `vm`, so the two boots overlap.
    let guest = guest_files();
    let _bench_pages = std::thread::scope(|scope| {
        let second = scope.spawn(|| create_linux_enclave(&daemon.socket, "vm2", "256M", false, &guest));
        let pages = if bench {
            create_bench_vm(&daemon.socket, &guest)
        } else {
            create_linux_enclave(&daemon.socket, "vm", "256M", false, &guest);
            None
        };
        second.join().unwrap();
        pages
    });

    // The host side starts once the guest has made its segment: a job's start in a guest may
    // take longer than either side waits for the other's name (both give up after 600 s).
    let guest_out = Arc::new(Mutex::new(String::new()));
    let guest = {
        let (socket, program, cwd, out) = (daemon.socket.clone(), program.clone(), dir.0.clone(), guest_out.clone());
        std::thread::spawn(move || run_job(&socket, "vm", &program, &["./vm_exchange", "guest"], &cwd, &out))
    };
    while !guest_out.lock().unwrap().contains("guest: made vm-to-host") && !guest.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let host = Command::new(&program)
        .arg("host")
        .env("CLOWDER_XEMEM_SOCKET", &daemon.xemem_socket)
        .env("CLOWDER_XEMEM_BACKEND", "broker")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reply = guest.join().unwrap();
    let guest_out = guest_out.lock().unwrap().clone();
    let host = host.wait_with_output().unwrap();
    let host_out = String::from_utf8_lossy(&host.stdout);
    let context = format!(
        "guest job {reply}:\n{guest_out}\nhost {:?}:\n{host_out}{}\nlog:\n{}",
        host.status,
        String::from_utf8_lossy(&host.stderr),
        log_lines(&daemon.socket, "vm").join("\n")
    );
    eprintln!("{context}");
    assert!(guest_out.contains("guest: 256 of 256 pages of host-to-vm hold what the other side wrote"), "{context}");
    assert!(guest_out.contains("guest: the other side wrote into vm-to-host"), "{context}");
    assert!(host_out.contains("host: 256 of 256 pages of vm-to-host hold what the other side wrote"), "{context}");
    assert!(host_out.contains("host: the other side wrote into host-to-vm"), "{context}");
    // Signals both ways (the guest owner's through its agent), and revocation both ways:
    // SIGBUS on the host from its kernel, in the guest from its agent (SI_USER).
    assert!(guest_out.contains("guest: the other side signalled vm-to-host"), "{context}");
    assert!(host_out.contains("host: the other side signalled host-to-vm"), "{context}");
    assert!(host_out.contains("host: SIGBUS inside vm-to-host once the guest removed it"), "{context}");
    assert!(guest_out.contains("guest: SIGBUS (SI_USER) touching host-to-vm once the other side removed it"), "{context}");
    assert!(host.status.success(), "{context}");
    assert_eq!(reply["status"], 0, "{context}");

    a_process_that_ends_keeps_no_segment(&daemon, &program, &dir.0);
    vm_and_vm_exchange(&daemon, &program, &dir.0);
    lwk_and_vm_exchange(&daemon, &program, &dir.0);
    if bench {
        bench_rows(&daemon, &dir.0);
    }
    let removed = call(&daemon.socket, json!({"op": "rm", "name": "vm"}));
    assert_eq!(removed["ok"], true, "{removed}");
    // The VM's link is gone with it: nothing of its segments is left at the name server.
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.links.list().iter().any(|listing| listing.name.as_ref().is_some_and(|n| n.as_bytes() == b"vm-to-host")) {
        assert!(Instant::now() < deadline, "the VM's segment outlived it");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A guest process that exports and ends without removing (`vm_exchange leave`): the agent's
/// keeper removes its segment, so the host attacher (`vm_exchange stay`) gets SIGBUS, having
/// read only what the guest wrote, never the guest kernel's reuse of the pages.
fn a_process_that_ends_keeps_no_segment(daemon: &BrokeredDaemon, program: &Path, dir: &Path) {
    let out = Arc::new(Mutex::new(String::new()));
    let guest = {
        let (socket, program, cwd, out) = (daemon.socket.clone(), program.to_path_buf(), dir.to_path_buf(), out.clone());
        std::thread::spawn(move || run_job(&socket, "vm", &program, &["./vm_exchange", "leave"], &cwd, &out))
    };
    while !out.lock().unwrap().contains("leave: made vm-leaves") && !guest.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let host = Command::new(program)
        .arg("stay")
        .env("CLOWDER_XEMEM_SOCKET", &daemon.xemem_socket)
        .env("CLOWDER_XEMEM_BACKEND", "broker")
        .output()
        .unwrap();
    let reply = guest.join().unwrap();
    let host_out = String::from_utf8_lossy(&host.stdout);
    let context = format!(
        "guest job {reply}:\n{}\nhost {:?}:\n{host_out}{}\nlog:\n{}",
        out.lock().unwrap(),
        host.status,
        String::from_utf8_lossy(&host.stderr),
        log_lines(&daemon.socket, "vm").join("\n")
    );
    eprintln!("{context}");
    assert_eq!(reply["status"], 0, "{context}");
    assert!(host_out.contains("host: SIGBUS inside vm-leaves once its guest process ended"), "{context}");
    assert!(host.status.success(), "{context}");
}

/// Runs `vm_exchange ROLE` in enclave `enclave` to its end on a thread: (reply, stdout).
fn exchange_job(
    daemon: &BrokeredDaemon,
    program: &Path,
    dir: &Path,
    enclave: &'static str,
    role: &'static str,
) -> std::thread::JoinHandle<(serde_json::Value, String)> {
    let (socket, program, cwd) = (daemon.socket.clone(), program.to_path_buf(), dir.to_path_buf());
    std::thread::spawn(move || run_job_to_end(&socket, enclave, &program, &["./vm_exchange", role], &cwd))
}

/// VM<->VM: the same binary in the second VM in the host's place (`vm_exchange vmhost`) and in
/// the first: both directions by content through the two VMs' windows, each side's signal
/// counted by the other's notify descriptor (through its agent), and each side's removal
/// ending in SIGBUS (SI_USER, from its agent) for the other's attacher. Then `vm2`
/// goes, and its segment with it (its core is the LWK enclave's next).
fn vm_and_vm_exchange(daemon: &BrokeredDaemon, program: &Path, dir: &Path) {
    let (owner, guest) = (exchange_job(daemon, program, dir, "vm2", "vmhost"), exchange_job(daemon, program, dir, "vm", "guest"));
    let ((owner_reply, owner_out), (guest_reply, guest_out)) = (owner.join().unwrap(), guest.join().unwrap());
    let context = format!(
        "vm2 job {owner_reply}:\n{owner_out}\nvm job {guest_reply}:\n{guest_out}\nvm2 log:\n{}",
        log_lines(&daemon.socket, "vm2").join("\n")
    );
    eprintln!("{context}");
    assert!(owner_out.contains("vmhost: 256 of 256 pages of vm-to-host hold what the other side wrote"), "{context}");
    assert!(guest_out.contains("guest: 256 of 256 pages of host-to-vm hold what the other side wrote"), "{context}");
    assert!(owner_out.contains("vmhost: the other side wrote into host-to-vm"), "{context}");
    assert!(guest_out.contains("guest: the other side wrote into vm-to-host"), "{context}");
    assert!(guest_out.contains("guest: the other side signalled vm-to-host"), "{context}");
    assert!(owner_out.contains("vmhost: the other side signalled host-to-vm"), "{context}");
    assert!(guest_out.contains("guest: signalled host-to-vm and removed vm-to-host"), "{context}");
    assert!(owner_out.contains("vmhost: SIGBUS (SI_USER) touching vm-to-host once the other side removed it"), "{context}");
    assert!(guest_out.contains("guest: SIGBUS (SI_USER) touching host-to-vm once the other side removed it"), "{context}");
    assert_eq!((owner_reply["status"].clone(), guest_reply["status"].clone()), (json!(0), json!(0)), "{context}");
    let removed = call(&daemon.socket, json!({"op": "rm", "name": "vm2"}));
    assert_eq!(removed["ok"], true, "{removed}");
}

/// LWK<->VM: the same binary as a job of an LWK enclave beside the VM (`vm_exchange host`,
/// libxpmem's device backend there) and in the VM: both directions by content, signals both
/// ways, SIGBUS in the LWK job once the guest removed its segment and in the guest (from its
/// agent) once the LWK job removed its own.
fn lwk_and_vm_exchange(daemon: &BrokeredDaemon, program: &Path, dir: &Path) {
    let created = call(&daemon.socket, json!({"op": "create", "name": "lwk", "cores": 1, "mem": "256M"}));
    assert_eq!(created["ok"], true, "{created}");
    let (lwk, vm) = (exchange_job(daemon, program, dir, "lwk", "host"), exchange_job(daemon, program, dir, "vm", "guest"));
    let ((lwk_reply, lwk_out), (vm_reply, vm_out)) = (lwk.join().unwrap(), vm.join().unwrap());
    let context = format!("LWK job {lwk_reply}:\n{lwk_out}\nVM job {vm_reply}:\n{vm_out}");
    eprintln!("{context}");
    assert!(lwk_out.contains("host: 256 of 256 pages of vm-to-host hold what the other side wrote"), "{context}");
    assert!(vm_out.contains("guest: 256 of 256 pages of host-to-vm hold what the other side wrote"), "{context}");
    assert!(vm_out.contains("guest: the other side signalled vm-to-host"), "{context}");
    assert!(lwk_out.contains("host: the other side signalled host-to-vm"), "{context}");
    assert!(lwk_out.contains("host: SIGBUS inside vm-to-host once the guest removed it"), "{context}");
    assert!(vm_out.contains("guest: SIGBUS (SI_USER) touching host-to-vm once the other side removed it"), "{context}");
    assert_eq!((lwk_reply["status"].clone(), vm_reply["status"].clone()), (json!(0), json!(0)), "{context}");
    let removed = call(&daemon.socket, json!({"op": "rm", "name": "lwk"}));
    assert_eq!(removed["ok"], true, "{removed}");
}

/// The VM rows of docs/results/xemem-attach.md (Table 2): `xemem/bench/attach_bench.c`, one
/// static binary, owns a region on one side and attaches it from the other, attach alone and
/// attach + read against a local read on the attacher's side, for each size of `SIZES` (MiB,
/// default "128 256 512 1024"), `ATTACHES` (default 5) attaches and `READS` (3) attach + reads
/// each, all of it `RUNS` times (default 1), each run a new segment:
/// - VM->host and VM->LWK up to `VM_OWNER_MAX` MiB (default 128): one `attach_bench serve` job
///   in the VM exports every one of these segments in turn over one region, whose pages it
///   writes once, as the sizes first need them: every first touch of a guest page is emulated
///   guest kernel work on a PVM host (about 5 ms a page at load 4-8), so a region per segment
///   would take hours. The VM has that much more memory ([`bench_vm_mib`]);
/// - LWK->VM from an LWK enclave beside the VM (`LWK`, default 1, for both LWK directions);
///   `VM_ATTACHER=0` leaves LWK->VM and host->VM out (bench/xemem/vm-table2.sh measures the VM
///   owner's rows in a VM of their own, on 4 KiB pages: see there);
/// - host->VM with the host owner's region on 4 KiB and on 2 MiB pages (`BACKINGS`, default
///   "4k 2m"; hugepages reserved for the run, the 2m rows skipped if the kernel has too few).
///
/// A VM attacher's local buffer is `LOCAL_MIB` (default 256: eight times this machine's L3)
/// read repeatedly: a tmpfs file in the guest ([`LOCAL_FILE`]) that the first attacher job
/// allocates (about 30 minutes a GiB of emulated first touches) and the later ones map (a few). Prints `row DIRECTION ...` lines
/// (attach_bench's columns, and its `first` lines), `vm-owner made NAME MIB SECONDS` (the wait
/// for the make from the previous attacher's end, or the job's start: the new pages' first
/// touches, mlock and pagemap in the guest) and the VMM's memory beyond guest RAM. Run by
/// run: each run measures every direction and size. `PROBE_MIB` (default none) adds, after the
/// runs, bench/xemem/vm_read_probe.c in the VM against a host segment of that size (2 MiB
/// pages if reserved), `PROBE_ROUNDS` (3) rounds: each phase of an attach + read apart, its
/// `probe ...` lines, for the host's KVM counters on the vCPU thread to be read beside them.
/// bench/xemem/vm-table2.sh runs this and makes the tables of its rows; `make test-linux-xemem
/// CLOWDER_XEMEM_VM_BENCH=1` measures in the exchange's VM instead of booting a second one.
#[test]
#[ignore = "boots a Linux guest and measures: many minutes on a PVM host (by hand, once the exchange passes: -- --ignored vm_attach_bench)"]
fn vm_attach_bench() {
    let Some(dir) = job_test_dir("clowder-xemem-vm-bench") else { return };
    let daemon = start_daemon_with_broker(&dir.0);
    let _pages = create_bench_vm(&daemon.socket, &guest_files());
    bench_rows(&daemon, &dir.0);
    let removed = call(&daemon.socket, json!({"op": "rm", "name": "vm"}));
    assert_eq!(removed["ok"], true, "{removed}");
}

/// The VM attachers' local buffer in the guest, written once for all the jobs of a run.
const LOCAL_FILE: &str = "/run/attach-bench-local";

/// [`bench_rows`]' setting `name` (an environment variable), else `default`.
fn bench_setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// `SIZES` and the part of them a VM owner exports (up to `VM_OWNER_MAX`), in MiB.
fn bench_sizes() -> (Vec<u64>, Vec<u64>) {
    let sizes: Vec<u64> = bench_setting("SIZES", "128 256 512 1024").split_whitespace().map(|s| s.parse().unwrap()).collect();
    let owner_max: u64 = bench_setting("VM_OWNER_MAX", "128").parse().unwrap();
    let owned = sizes.iter().copied().filter(|&mib| mib <= owner_max).collect();
    (sizes, owned)
}

/// The memory of the benchmark's VM in MiB: at least 512, room for the VM owner's largest region
/// beside an attacher's local buffer, and 128 MiB for the guest's own use (its kernel, the agent);
/// and twice the local buffer, whose file ([`LOCAL_FILE`]) is on a tmpfs of half the guest's RAM.
fn bench_vm_mib() -> u64 {
    let local: u64 = bench_setting("LOCAL_MIB", "256").parse().unwrap();
    (bench_sizes().1.iter().copied().max().unwrap_or(0) + local + 128).max(2 * local + 128).max(512)
}

/// `HUGEPAGES` (default 1): the benchmark's enclaves (the VM and the LWK) get their RAM on 2 MiB
/// pages, as the host owner's 2m rows' memory is, so an attacher's local buffer and the memory
/// it attaches are read through the same host page size (on this machine a guest reads 4 KiB
/// host pages at about half the rate of 2 MiB ones). `None` for 4 KiB pages; else the pages
/// reserved for `mib` MiB, or 4 KiB pages when the kernel cannot give them (said on stderr).
fn bench_hugepages(what: &str, mib: u64) -> Option<support::hugepages::Reservation> {
    (bench_setting("HUGEPAGES", "1") == "1")
        .then(|| support::hugepages::Reservation::free_pages(mib / 2).map_err(|e| eprintln!("{what} on 4 KiB pages: {e}")).ok())
        .flatten()
}

/// The benchmark's VM, `vm`, booted on 2 MiB pages unless [`bench_hugepages`] says not: the
/// pages reserved for it.
fn create_bench_vm(socket: &Path, guest: &(PathBuf, PathBuf)) -> Option<support::hugepages::Reservation> {
    let mib = bench_vm_mib();
    let pages = bench_hugepages("the VM's RAM", mib);
    create_linux_enclave(socket, "vm", &format!("{mib}M"), pages.is_some(), guest);
    println!("vm-ram {mib} MiB on {} pages", if pages.is_some() { "2 MiB" } else { "4 KiB" });
    pages
}

/// [`vm_attach_bench`]'s measurements in Linux enclave `vm` of `daemon`, scratch files in `dir`.
fn bench_rows(daemon: &BrokeredDaemon, dir: &Path) {
    let bench = dir.join("attach_bench");
    build_musl_job("../bench/attach_bench.c", &bench).unwrap();
    let (sizes, owned) = bench_sizes();
    let (attaches, reads, local) =
        (bench_setting("ATTACHES", "5"), bench_setting("READS", "3"), format!("local={}@{LOCAL_FILE}", bench_setting("LOCAL_MIB", "256")));
    let runs: u32 = bench_setting("RUNS", "1").parse().unwrap();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let host = |args: &[String]| {
        Command::new(&bench)
            .args(args)
            .env("CLOWDER_XEMEM_SOCKET", &daemon.xemem_socket)
            .env("CLOWDER_XEMEM_BACKEND", "broker")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A job on a thread, its output as it comes (an attacher starts once its owner has made the
    // segment: a VM owner's first touches of its region outlast attach_bench's lookup wait).
    let job = |enclave: &'static str, args: Vec<String>| {
        let (socket, cwd, bench) = (daemon.socket.clone(), dir.to_path_buf(), bench.clone());
        let out = Arc::new(Mutex::new(String::new()));
        let theirs = out.clone();
        let handle = std::thread::spawn(move || {
            let argv: Vec<&str> = std::iter::once("./attach_bench").chain(args.iter().map(String::as_str)).collect();
            let reply = run_job(&socket, enclave, &bench, &argv, &cwd, &theirs);
            let text = theirs.lock().unwrap().clone();
            (reply, text)
        });
        (handle, out)
    };
    type Job = (std::thread::JoinHandle<(serde_json::Value, String)>, Arc<Mutex<String>>);
    // Waits until `owner` has made segment `name`; false if it ended first.
    let made = |owner: &Job, name: &str| {
        let line = format!("made {name}:");
        while !owner.1.lock().unwrap().contains(&line) {
            if owner.0.is_finished() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        true
    };
    let run_sizes = |sizes: &[u64]| (0..runs).flat_map(move |run| sizes.iter().map(move |&mib| (run, mib))).collect::<Vec<_>>();
    let owner_args = |name: &str, backing: &str, mib: u64| vec!["own".into(), name.into(), backing.into(), mib.to_string(), "3600".into()];
    let attacher_args = |name: &str, mib: u64, in_vm: bool| {
        let mut args: Vec<String> =
            vec!["attach".into(), name.into(), mib.to_string(), attaches.clone(), reads.clone(), "attach".into(), "read".into()];
        args.extend(in_vm.then(|| local.clone()));
        args
    };
    let rows = |direction: &str, out: &str| {
        for line in out.lines().filter(|l| ["attach ", "read ", "owner-read ", "first "].iter().any(|p| l.starts_with(p))) {
            println!("row {direction} {line}");
        }
    };
    // Both LWK directions: an LWK enclave beside the VM, big enough for the largest region twice.
    let lwk = bench_setting("LWK", "1") == "1";
    // VM_ATTACHER=0 leaves out the directions into the VM (a run for the VM-owner rows alone).
    let vm_attacher = bench_setting("VM_ATTACHER", "1") == "1";
    let lwk_pages = lwk.then(|| {
        let mib = 2 * largest + 256;
        let pages = bench_hugepages("the LWK's RAM", mib);
        let created = call(
            &daemon.socket,
            json!({"op": "create", "name": "lwk", "cores": 1, "mem": format!("{mib}M"), "hugepages": pages.is_some()}),
        );
        assert_eq!(created["ok"], true, "{created}");
        println!("lwk-ram {mib} MiB on {} pages", if pages.is_some() { "2 MiB" } else { "4 KiB" });
        pages
    });
    let hugepages = support::hugepages::Reservation::free_pages(largest / 2).map_err(|e| eprintln!("host->VM 2m rows skipped: {e}")).ok();
    let backings = bench_setting("BACKINGS", "4k 2m");
    let backings: Vec<&str> = backings.split_whitespace().filter(|&b| b == "4k" || (b == "2m" && hugepages.is_some())).collect();

    // VM->host and VM->LWK: one owner job serves all their segments in turn ([`vm_attach_bench`]).
    let served: Vec<(u32, &str, String, u64)> = run_sizes(&owned)
        .into_iter()
        .flat_map(|(run, mib)| {
            let to_lwk = lwk.then(|| (run, "vm->lwk", format!("vl{mib}r{run}"), mib));
            std::iter::once((run, "vm->host", format!("vh{mib}r{run}"), mib)).chain(to_lwk)
        })
        .collect();
    let owner = (!served.is_empty()).then(|| {
        let mut args: Vec<String> = vec!["serve".into(), "4k".into(), "3600".into()];
        args.extend(served.iter().map(|(_, _, name, mib)| format!("{name}:{mib}")));
        job("vm", args)
    });
    // Run by run, every direction in each: a benchmark stopped for the machine's time leaves
    // whole runs of every direction.
    for run in 0..runs {
        // What the bench waits for each make (the first: from the job's start; a later run's
        // first segment is made while the other directions run).
        let mut since = Instant::now();
        for (_, direction, name, mib) in served.iter().filter(|entry| entry.0 == run) {
            let owner = owner.as_ref().unwrap();
            assert!(made(owner, name), "the VM owner ended before making {name}: {}", owner.1.lock().unwrap());
            println!("vm-owner made {name} {mib} {:.1}", since.elapsed().as_secs_f64());
            let out = if *direction == "vm->host" {
                let attacher = host(&attacher_args(name, *mib, false)).wait_with_output().unwrap();
                assert!(attacher.status.success(), "VM->host {name}: {}", String::from_utf8_lossy(&attacher.stderr));
                String::from_utf8_lossy(&attacher.stdout).into_owned()
            } else {
                let (reply, out) = job("lwk", attacher_args(name, *mib, false)).0.join().unwrap();
                assert_eq!(reply["status"], 0, "VM->LWK {name}: {reply}\n{out}");
                out
            };
            rows(direction, &out);
            since = Instant::now();
        }
        for &mib in sizes.iter().filter(|_| lwk && vm_attacher) {
            let name = format!("lv{mib}r{run}");
            let owner = job("lwk", owner_args(&name, "4k", mib));
            let attacher = made(&owner, &name).then(|| job("vm", attacher_args(&name, mib, true)));
            let Some(attacher) = attacher else {
                let (owner_reply, owner_out) = owner.0.join().unwrap();
                panic!("the LWK owner ended before making {name}: {owner_reply}\n{owner_out}")
            };
            // The attacher first: an owner whose attacher failed waits for its signal an hour.
            let (reply, out) = attacher.0.join().unwrap();
            assert_eq!(reply["status"], 0, "LWK->VM {name}: the attacher failed: {reply}\n{out}");
            let (owner_reply, owner_out) = owner.0.join().unwrap();
            let context = format!("LWK->VM {name}: owner {owner_reply}\n{owner_out}\nattacher {reply}\n{out}");
            assert_eq!(owner_reply["status"], 0, "{context}");
            rows("lwk->vm", &out);
            rows("lwk->vm", &owner_out);
        }
        for (&backing, &mib) in backings.iter().filter(|_| vm_attacher).flat_map(|backing| sizes.iter().map(move |mib| (backing, mib))) {
            let name = format!("h{backing}v{mib}r{run}");
            let mut owner = host(&owner_args(&name, backing, mib));
            let (reply, out) = job("vm", attacher_args(&name, mib, true)).0.join().unwrap();
            if reply["status"] != 0 {
                // Else the owner would wait an hour for the attacher's signal.
                let _ = owner.kill();
            }
            let owner = owner.wait_with_output().unwrap();
            let context = format!("host-{backing}->VM {mib} MiB: {reply}\n{out}\nowner: {}", String::from_utf8_lossy(&owner.stderr));
            assert_eq!(reply["status"], 0, "{context}");
            rows(&format!("host-{backing}->vm"), &out);
            rows(&format!("host-{backing}->vm"), &String::from_utf8_lossy(&owner.stdout));
        }
    }
    if let Some((owner, out)) = owner {
        let reply = owner.join().unwrap().0;
        assert_eq!(reply["status"], 0, "the VM owner: {reply}\n{}", out.lock().unwrap());
    }
    if lwk {
        let removed = call(&daemon.socket, json!({"op": "rm", "name": "lwk"}));
        assert_eq!(removed["ok"], true, "{removed}");
    }
    if let Ok(mib) = std::env::var("PROBE_MIB") {
        let probe = dir.join("vm_read_probe");
        build_musl_job("../../bench/xemem/vm_read_probe.c", &probe).unwrap();
        let (name, backing) = (format!("probe{mib}"), if hugepages.is_some() { "2m" } else { "4k" });
        let owner = host(&owner_args(&name, backing, mib.parse().unwrap()));
        let argv =
            ["./vm_read_probe", name.as_str(), mib.as_str(), &bench_setting("PROBE_ROUNDS", "3"), &bench_setting("LOCAL_MIB", "256")];
        // The host's clock around the job, to place its phases among the host's counters.
        let epoch = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let launched = epoch();
        let (reply, out) = run_job_to_end(&daemon.socket, "vm", &probe, &argv, dir);
        let owner = owner.wait_with_output().unwrap();
        assert_eq!(reply["status"], 0, "vm_read_probe: {reply}\n{out}\nowner: {}", String::from_utf8_lossy(&owner.stderr));
        println!("probe host backing {backing}, job launched {launched:.3}, ended {:.3} (host epoch s)", epoch());
        out.lines().filter(|l| l.starts_with("probe ")).for_each(|l| println!("{l}"));
    }
    drop((hugepages, lwk_pages));
    let listing = call(&daemon.socket, json!({"op": "ls"}));
    let pid = listing["enclaves"].as_array().unwrap().iter().find(|e| e["name"] == "vm").and_then(|e| e["pid"].as_u64()).unwrap();
    // RSS by kind, and the proportional set (the guest's RAM memfd is shared with the daemon).
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let keys = ["VmRSS:", "RssAnon:", "RssFile:", "RssShmem:", "Pss:", "Pss_Anon:", "Pss_File:", "Pss_Shmem:"];
    for line in status.lines().chain(rollup.lines()).filter(|l| keys.iter().any(|k| l.starts_with(k))) {
        println!("vmm-memory {line}");
    }
}
