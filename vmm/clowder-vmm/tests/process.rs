//! `clowder-vmm` as a process: what its exit status, stderr and files say when it is told to stop
//! by a signal, when its configuration is wrong, and when the guest misbehaves; and where its
//! serial output goes. (Exit statuses: `vmm::StopReason::exit_code`; guests:
//! kernels/testguest/README.md.)

#[macro_use]
mod support;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{run_with_args, testguest, wait_until, Ended, Launch, Scratch, DEADLINE, ENDLESS_NOPS};

#[test]
fn sigterm_tears_the_vm_down_cleanly_with_status_143() {
    require_kvm!();
    let (vmm, mut control) = Launch::testguest(ENDLESS_NOPS).start_controlled();
    wait_until("the guest runs", || control.exits("hypercall") > 0);
    let socket = vmm.control_path();
    // SAFETY: signals the child we started and still own.
    assert_eq!(unsafe { libc::kill(vmm.pid() as libc::pid_t, libc::SIGTERM) }, 0);
    let ended = vmm.wait();
    assert_eq!(ended.code(), 128 + libc::SIGTERM, "{ended}");
    assert_eq!(ended.stderr_lines(), ["clowder-vmm: stopped by signal 15; VM torn down"], "{ended}");
    assert!(!socket.exists(), "the control socket is removed on the way out");
}

#[test]
fn a_vm_told_its_parent_stops_when_the_parent_is_killed() {
    require_kvm!();
    // A shell starts the VMM naming itself as the parent to follow, prints the VMM's pid and
    // waits; SIGKILL gives the shell no chance to clean up, as a crashed daemon would not.
    // The VMM's stderr is a pipe only the shell reads, as a daemon's is: once the reader is
    // dead, saying why it stops (a write that fails with EPIPE) must not keep it from stopping.
    let scratch = Scratch::new("vmm-parent");
    let script = format!(
        "mkfifo {fifo} && exec 4<>{fifo}; CLOWDER_VMM_PARENT=$$ \"$0\" --kernel {} --mem 16M --cmdline '{ENDLESS_NOPS}' --serial null 2>{fifo} 4<&- & echo $!; wait",
        testguest().display(),
        fifo = scratch.path().join("stderr.fifo").display(),
    );
    let mut shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .arg(support::CLOWDER_VMM)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(shell.stdout.take().unwrap()), &mut line).unwrap();
    let vmm_pid: libc::pid_t = line.trim().parse().expect("the shell prints the VMM's pid");
    let alive = |pid: libc::pid_t| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "));
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(vmm_pid), "the VM runs while its parent lives");
    shell.kill().unwrap();
    shell.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(vmm_pid) {
        assert!(Instant::now() < deadline, "clowder-vmm {vmm_pid} outlived its parent by 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serial_output_to_a_file() {
    require_kvm!();
    let ended = Launch::testguest("test=serial lines=4").start().wait();
    assert_eq!(ended.code(), 0, "{ended}");
    let expected = "testguest: test=serial vcpu=0 boot=pvh\n\
                    serial: line 1 of 4\nserial: line 2 of 4\nserial: line 3 of 4\nserial: line 4 of 4\n\
                    serial: done\n";
    assert_eq!(ended.serial, expected);
}

/// Reads from a serial-socket client until `expected` bytes arrived (or the deadline passes).
fn read_serial_client(path: &std::path::Path, expected: usize) -> String {
    let mut client = UnixStream::connect(path).unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
    client.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let mut received = Vec::new();
    while received.len() < expected && Instant::now() < deadline {
        let mut buffer = [0u8; 1024];
        match client.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("reading the serial socket: {e}"),
        }
    }
    String::from_utf8(received).unwrap()
}

#[test]
fn serial_output_to_a_unix_socket_keeps_a_backlog_for_late_clients() {
    require_kvm!();
    let scratch = Scratch::new("serial-socket");
    let socket = scratch.path().join("serial.sock");
    // `hang` prints two lines, then halts with interrupts off (no watchdog): the VM keeps running
    // with all its output written before any client connects.
    let mut vmm = Launch::testguest("test=hang").serial(format!("unix:{}", socket.display())).start();
    let expected = "testguest: test=hang vcpu=0 boot=pvh\nhang: halting with interrupts off\n";
    let mut control = vmm.control();
    // Each serial byte is one port write: once they are all counted, the output is in the past.
    wait_until("the guest has printed everything", || control.exits("port_out") >= expected.len() as u64);

    assert_eq!(read_serial_client(&socket, expected.len()), expected, "the first late client gets the backlog");
    assert_eq!(read_serial_client(&socket, expected.len()), expected, "and so does the next");

    control.call_ok(json!({"op": "stop"}));
    let ended = vmm.wait();
    assert_eq!(ended.code(), 0, "{ended}");
}

/// A configuration error: status 2 and exactly one stderr line, which names `key`.
fn assert_configuration_error(ended: &Ended, key: &str) {
    assert_eq!(ended.code(), 2, "{ended}");
    let lines = ended.stderr_lines();
    assert_eq!(lines.len(), 1, "exactly one line\n{ended}");
    assert!(lines[0].starts_with("clowder-vmm: ") && lines[0].contains(key), "{:?} should name {key}", lines[0]);
    ended.assert_no_panic();
}

/// A host core this process may not run on (so not "present" for a vCPU).
fn absent_core() -> usize {
    // SAFETY: reads our own affinity into a zeroed set.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most the set's size into `allowed`.
    assert_eq!(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) }, 0);
    // SAFETY: every core tested is below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).find(|&core| !unsafe { libc::CPU_ISSET(core, &allowed) }).expect("a core outside the affinity set")
}

#[test]
fn configuration_errors_exit_2_with_one_line_naming_the_key() {
    let kernel = testguest().display().to_string();
    assert_configuration_error(&run_with_args(&["--kernel", &kernel, "--frobnicate"]), "--frobnicate");
    assert_configuration_error(&run_with_args(&["--mem", "16M"]), "boot.kernel");
    assert_configuration_error(&run_with_args(&["--kernel", "/nonexistent/vmlinux"]), "--kernel");

    let scratch = Scratch::new("config-errors");
    let text_file = scratch.path().join("notes.txt");
    std::fs::write(&text_file, "this is not a kernel image\n".repeat(40)).unwrap();
    let ended = run_with_args(&["--kernel", &text_file.display().to_string()]);
    assert_configuration_error(&ended, "--kernel");
    assert!(ended.stderr.contains("neither an ELF64"), "{ended}");

    let core = absent_core().to_string();
    let ended = run_with_args(&["--kernel", &kernel, "--cores", &core]);
    assert_configuration_error(&ended, "--cores");
    assert!(ended.stderr.contains(&format!("core {core}")), "{ended}");
}

#[test]
fn hugepages_beyond_the_reserved_pool_are_a_configuration_error() {
    // Ask for more 2 MiB pages than are free (whatever is reserved), with a margin in case
    // another process frees some meanwhile.
    const MARGIN_PAGES: u64 = 64;
    let free_path = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
    // None: this kernel has no 2 MiB pool at all, which the VMM refuses just the same.
    let pool_free: Option<u64> = std::fs::read_to_string(free_path).ok().and_then(|s| s.trim().parse().ok());
    let free = pool_free.unwrap_or(0);
    let pages = free + MARGIN_PAGES;
    if pages * 2 > 1 << 20 {
        eprintln!("skipped: {free} free 2 MiB hugepages; more than that is beyond the 1 TiB memory limit");
        return;
    }
    let memory = format!("{}M", pages * 2);
    let ended = run_with_args(&["--kernel", &testguest().display().to_string(), "--backing", "2m", "--mem", &memory]);
    assert_configuration_error(&ended, "--backing");
    if pool_free.is_some() {
        assert!(ended.stderr.contains("vm.nr_hugepages"), "the line says how to reserve them\n{ended}");
    }
}

/// A failure: the documented status, the reason, the vCPU's registers, no panic.
fn assert_failure(ended: &Ended, status: i32, reason: &str) {
    assert_eq!(ended.code(), status, "{ended}");
    let first = ended.stderr_lines().first().copied().unwrap_or_default();
    assert!(first.starts_with("clowder-vmm: ") && first.contains(reason), "{first:?} should say {reason:?}\n{ended}");
    for register in ["rip=0x", "rsp=0x", "cr3=0x"] {
        assert!(ended.stderr.contains(register), "no {register} in the register dump\n{ended}");
    }
    ended.assert_no_panic();
}

#[test]
fn guest_failures_end_the_process_with_their_status_and_registers() {
    require_kvm!();
    let ended = Launch::testguest("test=triplefault").start().wait();
    assert_failure(&ended, 125, "triple-faulted");
    assert!(ended.serial.contains("triplefault: now"), "{ended}");

    let ended = Launch::testguest("test=badport port=0x999").start().wait();
    assert_failure(&ended, 126, "unhandled exit: write to port 0x999");

    // Nonsense to a device: a 1-byte write to the hypercall port, which takes `out %eax`.
    let ended = Launch::testguest("test=badport port=0x510").start().wait();
    assert_failure(&ended, 126, "device \"hypercall\" rejected");

    let started = Instant::now();
    let ended = Launch::testguest("test=hang").arg("--watchdog", "300ms").start().wait();
    assert_failure(&ended, 124, "stopped responding");
    assert!(started.elapsed() < Duration::from_secs(10), "the watchdog fired in time");
}
