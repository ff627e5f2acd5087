//! The control socket of a running `clowder-vmm`, driven from this test process, i.e. from
//! another process than the VMM: counters, pause/resume, the channel's descriptors and an echo
//! over them, guest memory and run-time regions, malformed requests, and stop.
//! (`vmm/core/src/control.rs` defines the protocol; kernels/testguest/README.md the guests.)

#[macro_use]
mod support;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use clowder_api::codec::LineSocket;
use clowder_channel::{Channel, Endpoint};
use serde_json::{json, Value};
use support::guest_support::{recv_within, send_within, sleep_announced};
use support::{file_identity, memfd, wait_until, Control, Launch, SharedMapping, DEADLINE, ENDLESS_NOPS, GUEST_MEMORY_BYTES};
use vmm::arch::layout::CMDLINE_ADDR;

#[test]
fn stats_pause_resume_and_stop_from_another_process() {
    require_kvm!();
    let (vmm, mut control) = Launch::testguest(ENDLESS_NOPS).start_controlled();

    // Counters are readable while the guest runs, and they move.
    let first = control.exits("hypercall");
    wait_until("the hypercall counter moves", || control.exits("hypercall") > first);
    assert_eq!(control.stats()["state"], "Running");

    // Paused: every vCPU is parked when `pause` returns, so the guest makes no progress at all.
    control.call_ok(json!({"op": "pause"}));
    let stats = control.stats();
    assert_eq!(stats["state"], "Paused", "{stats}");
    let paused_at = stats["exits"]["hypercall"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(control.exits("hypercall"), paused_at, "the guest ran while paused");
    control.call_ok(json!({"op": "pause"})); // pausing twice is harmless

    control.call_ok(json!({"op": "resume"}));
    assert_eq!(control.stats()["state"], "Running");
    wait_until("the guest makes hypercalls again after resume", || control.exits("hypercall") > paused_at);

    control.call_ok(json!({"op": "stop"}));
    let socket = vmm.control_path();
    let ended = vmm.wait();
    assert_eq!(ended.code(), 0, "a requested stop is a clean exit\n{ended}");
    assert!(ended.stderr.is_empty(), "{ended}");
    assert!(!socket.exists(), "the control socket is removed on exit");
}

/// The host end of the channel, driven from the descriptors the VMM sent.
struct RemoteChannel {
    endpoint: Endpoint,
    doorbell: File,
    interrupt: File,
    doorbells: u64,
    _mapping: SharedMapping,
}

impl RemoteChannel {
    /// Asks for the channel and attaches to the rings through the VM's memfd.
    fn attach(control: &mut Control) -> RemoteChannel {
        let (reply, files) = control.call_with_fds(json!({"op": "channel"}), &[]);
        assert_eq!(reply["ok"], true, "{reply}");
        assert_eq!(reply["fds"], json!(["memfd", "doorbell", "interrupt"]));
        let [memfd, doorbell, interrupt]: [File; 3] = files.try_into().expect("three descriptors");
        let size = reply["size"].as_u64().unwrap() as usize;
        let mapping = SharedMapping::map(memfd.as_raw_fd(), reply["memfd_offset"].as_u64().unwrap(), size);
        // SAFETY: the mapping is the formatted channel region and lives as long as the endpoint.
        let channel = unsafe { Channel::attach(mapping.as_ptr(), size) }.expect("a formatted channel");
        let endpoint = channel.host_end().expect("consistent counters");
        RemoteChannel { endpoint, doorbell, interrupt, doorbells: 0, _mapping: mapping }
    }

    fn send(&mut self, message: &[u8]) {
        send_within(&mut self.endpoint, message, DEADLINE);
        if self.endpoint.peer_waiting() {
            // The irqfd: raises the channel vector in the sleeping guest.
            self.interrupt.write_all(&1u64.to_ne_bytes()).expect("signalling the interrupt eventfd");
        }
    }

    /// Receives the next message, sleeping on the doorbell eventfd (poll, announce, re-check,
    /// sleep) while the ring is empty.
    fn recv(&mut self) -> Vec<u8> {
        let doorbell = self.doorbell.as_raw_fd();
        let doorbells = &mut self.doorbells;
        recv_within(&mut self.endpoint, DEADLINE, |endpoint| *doorbells += sleep_announced(endpoint, doorbell, Duration::from_secs(1)))
    }

    fn wait_until_guest_sleeps(&self) {
        wait_until("the guest sets its waiting flag", || self.endpoint.peer_waiting());
    }
}

#[test]
fn channel_descriptors_drive_a_doorbell_echo_from_another_process() {
    require_kvm!();
    let (vmm, mut control) = Launch::testguest("test=channel mode=doorbell").start_controlled();
    let mut channel = RemoteChannel::attach(&mut control);

    for index in 0..10u8 {
        let message = vec![index; 1 + usize::from(index) * 20];
        channel.send(&message);
        assert_eq!(channel.recv(), message);
    }
    // Messages sent only once the guest sleeps in `hlt` (10 ms is ~40,000 emulated guest
    // instructions after it set its flag) reach it only through the interrupt eventfd.
    const WHILE_ASLEEP: u64 = 3;
    for index in 0..WHILE_ASLEEP {
        channel.wait_until_guest_sleeps();
        std::thread::sleep(Duration::from_millis(10));
        let message = format!("asleep {index}").into_bytes();
        channel.send(&message);
        assert_eq!(channel.recv(), message);
    }
    channel.send(b"quit");
    assert_eq!(channel.recv(), b"bye");
    let ended = vmm.wait();
    assert_eq!(ended.code(), 0, "{ended}");
    let summary = ended.serial.lines().find(|l| l.starts_with("channel: quit after")).expect("the guest's summary");
    let wakeups: u64 = summary.rsplit_once(", ").unwrap().1.trim_end_matches(" wakeups").parse().unwrap();
    assert!(summary.starts_with(&format!("channel: quit after {} echoes", 10 + WHILE_ASLEEP)), "{ended}");
    assert!(wakeups >= WHILE_ASLEEP, "the sleeping guest was woken by our interrupt eventfd\n{ended}");
    assert!(channel.doorbells >= 1, "the guest's doorbell (an ioeventfd) reached this process");
}

const HOST_PATTERN: u64 = 0x1111_1111_0000_0000;
const GUEST_PATTERN: u64 = 0x2222_2222_0000_0000;
const WORDS_PER_PAGE: usize = 4096 / 8;

#[test]
fn memory_and_run_time_regions_from_another_process() {
    require_kvm!();
    let (vmm, mut control) = Launch::testguest("test=region").start_controlled();
    let mut channel = RemoteChannel::attach(&mut control);

    // Guest RAM: the memfd maps the guest-physical layout, so the command line is where the ABI
    // says.
    let (reply, files) = control.call_with_fds(json!({"op": "memory"}), &[]);
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["size"], GUEST_MEMORY_BYTES);
    assert_eq!(reply["ranges"], json!([{"gpa": 0, "size": GUEST_MEMORY_BYTES, "file_offset": 0}]));
    let [ram]: [File; 1] = files.try_into().expect("one descriptor");
    let ram_view = SharedMapping::map(ram.as_raw_fd(), CMDLINE_ADDR, 4096);
    assert!(ram_view.bytes(0, 12) == b"test=region ", "{:?}", String::from_utf8_lossy(&ram_view.bytes(0, 64)));

    // A region of our own, added while the guest runs.
    const LEN: usize = 64 * 1024;
    let region_fd = memfd(c"clowder-region-test", LEN);
    let region = SharedMapping::map(region_fd.as_raw_fd(), 0, LEN);
    for index in 0..LEN / 8 {
        region.write_u64(index, HOST_PATTERN | index as u64);
    }
    let (added, _) = control.call_with_fds(json!({"op": "add_region", "offset": 0, "len": LEN}), &[region_fd.as_raw_fd()]);
    assert_eq!(added["ok"], true, "{added}");
    let (slot, gpa) = (added["slot"].as_u64().unwrap(), added["gpa"].as_u64().unwrap());
    assert!(gpa >= GUEST_MEMORY_BYTES, "run-time regions go above RAM: {added}");
    assert_eq!(control.stats()["regions"], json!([{"slot": slot, "gpa": gpa, "len": LEN}]));

    // translate names our own file, at the right offset, and guest RAM's memfd below it.
    let (translated, files) = control.call_with_fds(json!({"op": "translate", "gpa": gpa + 4096, "len": 8192}), &[]);
    assert_eq!(translated["runs"], json!([{"fd_index": 0, "offset": 4096, "len": 8192}]), "{translated}");
    assert_eq!(file_identity(files[0].as_raw_fd()), file_identity(region_fd.as_raw_fd()), "the region's own memfd");
    let (translated, files) = control.call_with_fds(json!({"op": "translate", "gpa": CMDLINE_ADDR, "len": 4096}), &[]);
    assert_eq!(translated["runs"], json!([{"fd_index": 0, "offset": CMDLINE_ADDR, "len": 4096}]), "{translated}");
    assert_eq!(file_identity(files[0].as_raw_fd()), file_identity(ram.as_raw_fd()), "guest RAM's memfd");

    // The guest maps it, reads our pattern and writes its own, which we see in our mapping.
    channel.send(format!("map {gpa:x} {LEN:x}").as_bytes());
    assert_eq!(String::from_utf8(channel.recv()).unwrap(), format!("mapped {gpa:x} {LEN:x} bad 0"));
    for page in 0..LEN / 4096 {
        for index in [page * WORDS_PER_PAGE, (page + 1) * WORDS_PER_PAGE - 1] {
            assert_eq!(region.read_u64(index), GUEST_PATTERN | index as u64, "word {index}");
        }
    }

    let removed = control.call_ok(json!({"op": "remove_region", "slot": slot}));
    assert_eq!((removed["slot"].as_u64(), removed["gpa"].as_u64()), (Some(slot), Some(gpa)));
    assert_eq!(control.stats()["regions"], json!([]));
    let gone = control.call(json!({"op": "translate", "gpa": gpa, "len": 4096}));
    assert_eq!(gone["ok"], false, "a removed region no longer translates: {gone}");
    let again = control.call(json!({"op": "remove_region", "slot": slot}));
    assert_eq!(again["ok"], false, "{again}");

    channel.send(b"quit");
    assert_eq!(channel.recv(), b"bye");
    let ended = vmm.wait();
    assert_eq!(ended.code(), 0, "{ended}");
    assert!(ended.serial.contains("0 of 32 checked words differ"), "{ended}");
}

/// Sends one raw line (not necessarily JSON) and returns the parsed reply.
fn raw_request(socket: &mut LineSocket, line: &[u8]) -> Value {
    socket.stream().write_all(line).unwrap();
    reply_on(socket)
}

fn reply_on(socket: &mut LineSocket) -> Value {
    let (reply, files) = socket.receive_json().unwrap().expect("a reply, not end of stream");
    assert!(files.is_empty());
    reply
}

#[test]
fn malformed_requests_are_answered_with_errors_while_the_vm_keeps_running() {
    require_kvm!();
    let (vmm, mut control) = Launch::testguest(ENDLESS_NOPS).start_controlled();
    // The socket serves before the vCPUs start (state "Created"): wait until the guest runs.
    wait_until("the guest runs", || control.exits("hypercall") > 0);
    let mut socket = LineSocket::new(UnixStream::connect(vmm.control_path()).unwrap(), clowder_api::vmm::LIMITS);
    let extra_fd = memfd(c"clowder-extra", 4096);

    let raw_cases: [(&[u8], &str); 6] = [
        (b"this is not json\n", "malformed request"),
        (b"[1, 2]\n", "JSON object"),
        (b"{\"op\": 7}\n", "`op`"),
        (b"{\"op\": \"frobnicate\"}\n", "unknown op"),
        (b"{\"op\": \"translate\", \"gpa\": 0}\n", "`len`"),
        (b"{\"op\": \"remove_region\"}\n", "`slot`"),
    ];
    for (line, expected) in raw_cases {
        let reply = raw_request(&mut socket, line);
        assert_eq!(reply["ok"], false, "{}: {reply}", String::from_utf8_lossy(line));
        let error = reply["error"].as_str().unwrap();
        assert!(error.contains(expected), "{}: {error:?} should mention {expected:?}", String::from_utf8_lossy(line));
    }
    // add_region with the wrong number of descriptors (none, two).
    let request = json!({"op": "add_region", "offset": 0, "len": 4096});
    for fds in [vec![], vec![extra_fd.as_raw_fd(), extra_fd.as_raw_fd()]] {
        socket.send(&request, &fds).unwrap();
        let reply = reply_on(&mut socket);
        assert_eq!(reply["ok"], false, "{reply}");
        let expected = format!("exactly one file descriptor, got {}", fds.len());
        assert!(reply["error"].as_str().unwrap().contains(&expected), "{reply}");
    }
    // read_only must be a boolean; a read-only region is added (KVM_MEM_READONLY) and removed.
    let request = json!({"op": "add_region", "offset": 0, "len": 4096, "read_only": "yes"});
    socket.send(&request, &[extra_fd.as_raw_fd()]).unwrap();
    let reply = reply_on(&mut socket);
    assert!(reply["ok"] == false && reply["error"].as_str().unwrap().contains("`read_only`: invalid type"), "{reply}");
    let request = json!({"op": "add_region", "offset": 0, "len": 4096, "read_only": true});
    socket.send(&request, &[extra_fd.as_raw_fd()]).unwrap();
    let reply = reply_on(&mut socket);
    assert_eq!(reply["ok"], true, "{reply}");
    let removed = raw_request(&mut socket, format!("{{\"op\": \"remove_region\", \"slot\": {}}}\n", reply["slot"]).as_bytes());
    assert_eq!(removed["ok"], true, "{removed}");
    // Well-formed but impossible.
    let reply = raw_request(&mut socket, b"{\"op\": \"remove_region\", \"slot\": 77}\n");
    assert_eq!(reply["ok"], false, "{reply}");

    // The same connection still serves, and the guest never stopped running.
    let reply = raw_request(&mut socket, b"{\"op\": \"stats\"}\n");
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["state"], "Running");
    let before = reply["exits"]["hypercall"].as_u64().unwrap();
    wait_until("the guest keeps making hypercalls", || control.exits("hypercall") > before);

    control.call_ok(json!({"op": "stop"}));
    let ended = vmm.wait();
    assert_eq!(ended.code(), 0, "{ended}");
    ended.assert_no_panic();
}

/// Connects to `path` from a thread that runs as uid and gid 65534 (the raw syscall changes only
/// the calling thread's credentials, which both the file check and SO_PEERCRED see) and returns
/// the line the VMM sends before any request (a refusal), or the connect error.
fn first_reply_as_nobody(path: std::path::PathBuf) -> std::io::Result<Value> {
    std::thread::spawn(move || {
        // SAFETY: setresgid/setresuid on this thread only; it ends right after.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        let stream = UnixStream::connect(&path)?;
        // Bounded, so a VMM that lets us in and waits for a request fails the test, not hangs it.
        let limits = clowder_api::codec::Limits { timeout: Some(DEADLINE), ..clowder_api::vmm::LIMITS };
        let mut socket = LineSocket::new(stream, limits);
        Ok(socket.receive_json().expect("a reply line").expect("a reply before the close").0)
    })
    .join()
    .unwrap()
}

#[test]
fn only_the_vmms_own_uid_or_root_may_use_the_control_socket() {
    require_kvm!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching to another uid needs root");
        return;
    }
    let (vmm, mut control) = Launch::testguest(ENDLESS_NOPS).start_controlled();
    let path = vmm.control_path();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is private whatever the umask");
    let refused = first_reply_as_nobody(path.clone()).expect_err("the file mode keeps others out");
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied, "{refused}");

    // Opened up by mistake, the socket still refuses another uid: it can read and write guest RAM.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let reply = first_reply_as_nobody(path).unwrap();
    assert_eq!((reply["ok"].clone(), reply["kind"].clone()), (json!(false), json!("permission_denied")), "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("uid 65534"), "{reply}");

    // The VMM's own uid still drives it.
    control.call_ok(json!({"op": "stop"}));
    assert_eq!(vmm.wait().code(), 0);
}
