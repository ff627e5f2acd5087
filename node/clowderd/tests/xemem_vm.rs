//! The daemon's side of a Linux VM's XEMEM device (`clowderd::xemem::vm`) with fake VMs: RAM
//! memfds whose pages say their frame number, and window slots recorded instead of made. The
//! reduced form of `make test-linux-enclave`'s XEMEM part: host<->VM, VM<->VM, revocation when
//! the owner's VM goes, and garbage from the guest.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use clowderd::guest_ram::{GuestRam, RamRange};
use clowderd::xemem::vm::{VmOwner, VmXemem, Window, WindowSlots};
use clowderd::xemem::{FileRun, XememLinks};
use vmm::pci::link::Call;
use vmm::pci::mailbox::Op;
use xemem::ids::SegmentId;
use xemem::pci::GuestEvent;
use xemem::Credentials;

mod support;
use support::processes::support_program;
use support::{cc_against_libxpmem, TempDir};

const MIB: u64 = 1 << 20;
const WINDOW: u64 = 1 << 45;

/// RAM of `size` bytes whose every page starts with `tag` and its frame number.
fn fake_ram(size: u64, tag: u64) -> Arc<GuestRam> {
    let file = clowderd::sys::memfd("vm-xemem-test").unwrap();
    file.set_len(size).unwrap();
    for frame in 0..size / 4096 {
        file.write_all_at(&[tag.to_le_bytes(), frame.to_le_bytes()].concat(), frame * 4096).unwrap();
    }
    let ranges = vec![RamRange { gpa: 0, size, file_offset: 0 }];
    Arc::new(GuestRam::map(&file, ranges, (size - 4096, 4096)).unwrap())
}

fn root() -> VmOwner {
    VmOwner { uid: 0, gid: 0, groups: vec![0] }
}

/// Slots as the VMM would make them, each with what its first two words read.
#[derive(Default)]
struct FakeSlots {
    live: Mutex<Vec<(u32, u64, u64, [u64; 2])>>,
    next: Mutex<u32>,
}

impl WindowSlots for FakeSlots {
    fn add(&self, file: &File, offset: u64, len: u64, gpa: u64) -> Result<u32, String> {
        let mut words = [0u8; 16];
        file.read_exact_at(&mut words, offset).map_err(|e| e.to_string())?;
        let mut next = self.next.lock().unwrap();
        *next += 1;
        let first = [u64::from_le_bytes(words[..8].try_into().unwrap()), u64::from_le_bytes(words[8..].try_into().unwrap())];
        self.live.lock().unwrap().push((*next, gpa, len, first));
        Ok(*next)
    }
    fn remove(&self, slot: u32) -> Result<(), String> {
        let mut live = self.live.lock().unwrap();
        let before = live.len();
        live.retain(|&(s, ..)| s != slot);
        if live.len() == before {
            return Err(format!("no slot {slot}"));
        }
        Ok(())
    }
}

fn request(op: Op, args: &[u64], name: Option<&str>, runs: Vec<(u64, u64)>) -> Call {
    let mut all = [0; 6];
    all[..args.len()].copy_from_slice(args);
    Call::Request { op: op as u32, args: all, name: name.map(str::to_string), runs }
}

/// A VM on its own thread, pumping between the calls it is given (as its serving thread
/// does between the VMM's calls).
struct VmThread {
    calls: mpsc::Sender<(Call, mpsc::Sender<Result<[u64; 4], i32>>)>,
    thread: std::thread::JoinHandle<()>,
    slots: Arc<FakeSlots>,
    /// What the VM's guest agent was told.
    told: Arc<Mutex<Vec<GuestEvent>>>,
}

impl VmThread {
    fn start(links: &Arc<XememLinks>, ram: Arc<GuestRam>) -> VmThread {
        let mut vm = VmXemem::new(links, ram, root()).unwrap();
        let told = Arc::new(Mutex::new(Vec::new()));
        let agent = told.clone();
        vm.tell_agent(Box::new(move |event| {
            agent.lock().unwrap().push(event);
            Ok(())
        }));
        let (calls, inbox) = mpsc::channel::<(Call, mpsc::Sender<Result<[u64; 4], i32>>)>();
        let slots = Arc::new(FakeSlots::default());
        let theirs = slots.clone();
        let thread = std::thread::spawn(move || {
            let window = Window::new(&*theirs);
            loop {
                match inbox.recv_timeout(Duration::from_millis(2)) {
                    Ok((call, answer)) => {
                        let _ = answer.send(vm.serve(call, &window));
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => vm.pump(&window),
                    // Dropping the VM takes its link down, as when its VMM ends.
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        });
        VmThread { calls, thread, slots, told }
    }

    fn call(&self, call: Call) -> Result<[u64; 4], i32> {
        let (answer, answered) = mpsc::channel();
        self.calls.send((call, answer)).unwrap();
        answered.recv().unwrap()
    }

    fn stop(self) {
        drop(self.calls);
        self.thread.join().unwrap();
    }
}

/// Exports frames 0x100-0x101 and 0x300 of `vm` as a named 12 KiB segment of `mode`.
fn export(vm: &VmThread, name: &str, mode: u64) -> u64 {
    assert_eq!(vm.call(request(Op::Runs, &[0], None, vec![(0x100 * 4096, 0x2000)])), Ok([0; 4]));
    assert_eq!(vm.call(request(Op::Runs, &[1], None, vec![(0x300 * 4096, 0x1000)])), Ok([0; 4]));
    vm.call(request(Op::Make, &[0x7000_0000, 0x3000, 1, mode, 2], Some(name), Vec::new())).unwrap()[0]
}

#[test]
fn a_vm_export_reaches_the_host_frame_for_frame() {
    let links = XememLinks::new();
    let vm = VmThread::start(&links, fake_ram(4 * MIB, 0xa));
    assert_eq!(vm.call(request(Op::Hello, &[], None, Vec::new())), Ok([1, 0, 0, 0]));
    let segment = export(&vm, "vm-export", 0o600);
    assert_eq!(vm.call(request(Op::Lookup, &[], Some("vm-export"), Vec::new())), Ok([segment, 0, 0, 0]));
    let segment = SegmentId::from_raw(segment as i64).unwrap();
    assert_eq!(links.lookup("vm-export"), Ok(segment));
    let credentials = Credentials { uid: 0, groups: vec![0] };
    let (access, runs) = links.attach_enclave_segment(77, credentials.clone(), segment, 0x1000, 0x2000).unwrap();
    let frames: Vec<u64> = runs
        .iter()
        .flat_map(|run| match run {
            FileRun::Memory { file, offset, len } => (0..len / 4096)
                .map(|page| {
                    let mut word = [0u8; 8];
                    file.read_exact_at(&mut word, offset + page * 4096 + 8).unwrap();
                    u64::from_le_bytes(word)
                })
                .collect::<Vec<_>>(),
            FileRun::Hole { .. } => panic!("a hole in a VM export"),
        })
        .collect();
    assert_eq!(frames, [0x101, 0x300], "the host reads the VM's pages from the attach offset on");
    links.release(77, access).unwrap();
    // Removed, it is gone for the host too; a second remove finds nothing.
    assert_eq!(vm.call(request(Op::Remove, &[segment.raw() as u64], None, Vec::new())), Ok([0; 4]));
    assert!(links.attach_enclave_segment(77, credentials, segment, 0, 0x1000).is_err());
    assert_eq!(vm.call(request(Op::Remove, &[segment.raw() as u64], None, Vec::new())), Err(libc::ENOENT));
    vm.stop();
}

#[test]
fn one_vm_attaches_another_at_the_placement_and_loses_it_when_the_owner_goes() {
    let links = XememLinks::new();
    let owner = VmThread::start(&links, fake_ram(4 * MIB, 0xa));
    let attacher = VmThread::start(&links, fake_ram(4 * MIB, 0xb));
    let segment = export(&owner, "vm-to-vm", 0o666);
    let [apid, ..] = attacher.call(request(Op::Get, &[segment, xemem::ACCESS_READ_WRITE as u64, 1], None, Vec::new())).unwrap();
    let gpa = WINDOW + (2 << 20);
    let [token, ..] = attacher.call(Call::Place { apid, offset: 0, len: 0x3000, gpa }).unwrap();
    let live = attacher.slots.live.lock().unwrap().clone();
    let placed: Vec<(u64, u64, [u64; 2])> = live.iter().map(|&(_, gpa, len, first)| (gpa, len, first)).collect();
    assert_eq!(placed, [(gpa, 0x2000, [0xa, 0x100]), (gpa + 0x2000, 0x1000, [0xa, 0x300])], "the owner's pages, at the window place");
    // Detach keeps the slots while the permit is held (answered 1: the device parks the
    // place); an unknown token is refused.
    assert_eq!(attacher.call(Call::Unplace { token: token as u32 }), Ok([1, 0, 0, 0]));
    assert_eq!(*attacher.slots.live.lock().unwrap(), live, "kept");
    assert_eq!(attacher.call(Call::Unplace { token: token as u32 }), Err(libc::EINVAL));
    // The same permit attached again at the parked place takes the same slots: none added.
    let [token, ..] = attacher.call(Call::Place { apid, offset: 0, len: 0x3000, gpa }).unwrap();
    assert_eq!(*attacher.slots.live.lock().unwrap(), live, "re-attached");
    assert_eq!(attacher.call(Call::Unplace { token: token as u32 }), Ok([1, 0, 0, 0]));
    // Another range through it gets new slots at its own place; the kept ones go.
    let elsewhere = gpa + (2 << 20);
    let [token, ..] = attacher.call(Call::Place { apid, offset: 0x2000, len: 0x1000, gpa: elsewhere }).unwrap();
    let moved: Vec<(u64, u64, [u64; 2])> =
        attacher.slots.live.lock().unwrap().iter().map(|&(_, gpa, len, first)| (gpa, len, first)).collect();
    assert_eq!(moved, [(elsewhere, 0x1000, [0xa, 0x300])]);
    assert_eq!(attacher.call(Call::Unplace { token: token as u32 }), Ok([1, 0, 0, 0]));
    assert_eq!(attacher.slots.live.lock().unwrap().len(), 1);
    // The release removes what was kept.
    attacher.call(request(Op::Release, &[apid], None, Vec::new())).unwrap();
    assert!(attacher.slots.live.lock().unwrap().is_empty(), "released");

    // Attached again through a new permit, then the owner's VM goes: revoked, slots gone.
    let [apid, ..] = attacher.call(request(Op::Get, &[segment, xemem::ACCESS_READ_WRITE as u64, 1], None, Vec::new())).unwrap();
    attacher.call(Call::Place { apid, offset: 0x1000, len: 0x1000, gpa }).unwrap();
    assert_eq!(attacher.slots.live.lock().unwrap().len(), 1);
    owner.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !attacher.slots.live.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the attachment outlived its owner's VM");
        std::thread::sleep(Duration::from_millis(10));
    }
    attacher.stop();
}

/// Waits until `vm`'s agent was told `count` events.
fn told(vm: &VmThread, count: usize) -> Vec<GuestEvent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while vm.told.lock().unwrap().len() < count {
        assert!(Instant::now() < deadline, "the agent was told only {:?}", vm.told.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    vm.told.lock().unwrap().clone()
}

/// What a guest kernel module would deliver goes to the guest agents: an attacher's signal to
/// its VM owner, and the attacher's touch of the placement after the owner removed the
/// segment (SIGBUS there), at most once a placement per interval, never for unknown tokens.
#[test]
fn signals_to_a_vm_owner_and_touches_after_revocation_reach_the_guest_agents() {
    let links = XememLinks::new();
    let owner = VmThread::start(&links, fake_ram(4 * MIB, 0xa));
    let attacher = VmThread::start(&links, fake_ram(4 * MIB, 0xb));
    let segment = export(&owner, "vm-signalled", 0o666);
    let [apid, ..] = attacher.call(request(Op::Get, &[segment, xemem::ACCESS_READ_WRITE as u64, 1], None, Vec::new())).unwrap();
    let window_offset = 4 << 20;
    let [token, ..] = attacher.call(Call::Place { apid, offset: 0, len: 0x3000, gpa: WINDOW + window_offset }).unwrap();
    let token = token as u32;
    assert_eq!(attacher.call(request(Op::Signal, &[apid], None, Vec::new())), Ok([0; 4]));
    assert_eq!(attacher.call(request(Op::Signal, &[apid], None, Vec::new())), Ok([0; 4]));
    let signal = GuestEvent::Signal { segid: segment as i64 };
    assert_eq!(told(&owner, 2), [signal, signal], "every signal, none dropped");
    // The owner removes it: the attacher's slots go; its touch there is passed on once.
    assert_eq!(owner.call(request(Op::Remove, &[segment], None, Vec::new())), Ok([0; 4]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !attacher.slots.live.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the attachment outlived the owner's segment");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(attacher.call(Call::Touched { token, window_offset }), Ok([1, 0, 0, 0]));
    assert_eq!(attacher.call(Call::Touched { token, window_offset }), Ok([0; 4]), "within the interval");
    assert_eq!(attacher.call(Call::Touched { token: token + 1, window_offset }), Err(libc::EINVAL), "not a placement");
    std::thread::sleep(vmm::pci::touch::REPORT_INTERVAL);
    assert_eq!(attacher.call(Call::Touched { token, window_offset }), Ok([1, 0, 0, 0]), "after it");
    assert_eq!(told(&attacher, 2), [GuestEvent::Revoked { window_offset }; 2]);
    // Detached, the token is gone.
    attacher.call(Call::Unplace { token }).unwrap_or_default();
    assert_eq!(attacher.call(Call::Touched { token, window_offset }), Err(libc::EINVAL));
    assert_eq!(owner.told.lock().unwrap().len(), 2, "the owner was told nothing more");
    attacher.stop();
    owner.stop();
}

#[test]
fn garbage_from_the_guest_is_refused() {
    let links = XememLinks::new();
    let vm = VmThread::start(&links, fake_ram(4 * MIB, 0xa));
    let refused = |call: Call, errno: i32| assert_eq!(vm.call(call.clone()), Err(errno), "{call:?}");
    refused(Call::Request { op: 99, args: [0; 6], name: None, runs: Vec::new() }, libc::ENOSYS);
    // RUNS out of order, misaligned or empty; MAKE not matching what came.
    refused(request(Op::Runs, &[5], None, vec![(0, 4096)]), libc::EINVAL);
    refused(request(Op::Runs, &[0], None, vec![(100, 4096)]), libc::EINVAL);
    refused(request(Op::Runs, &[0], None, vec![(4096, 0)]), libc::EINVAL);
    assert_eq!(vm.call(request(Op::Runs, &[0], None, vec![(4096, 4096)])), Ok([0; 4]));
    refused(request(Op::Make, &[0x1000, 0x2000, 1, 0o600, 1], None, Vec::new()), libc::EINVAL);
    refused(request(Op::Make, &[0x1000, 0x1000, 1, 0o600, 1], None, Vec::new()), libc::EINVAL); // the runs went
                                                                                                // Frames outside the VM's RAM are made, but no attach of them is served.
    assert_eq!(vm.call(request(Op::Runs, &[0], None, vec![(64 * MIB, 4096)])), Ok([0; 4]));
    let [segment, ..] = vm.call(request(Op::Make, &[0x1000, 0x1000, 1, 0o600, 1], None, Vec::new())).unwrap();
    let segment = SegmentId::from_raw(segment as i64).unwrap();
    assert!(links.attach_enclave_segment(5, Credentials { uid: 0, groups: vec![0] }, segment, 0, 0x1000).is_err());
    // Permits and placements that do not exist or do not fit.
    refused(request(Op::Get, &[0x7fff_ffff, 3, 1], None, Vec::new()), libc::EINVAL); // not a segment id
    refused(Call::Place { apid: 12345, offset: 0, len: 4096, gpa: WINDOW }, libc::EINVAL); // not a permit id
    refused(Call::Place { apid: 12345, offset: 1, len: 4096, gpa: WINDOW }, libc::EINVAL);
    refused(Call::Place { apid: 12345, offset: 0, len: 4096, gpa: u64::MAX - 4095 }, libc::EINVAL);
    refused(Call::Unplace { token: 9 }, libc::EINVAL);
    refused(request(Op::Attach, &[1, 0, 4096], None, Vec::new()), libc::EINVAL);
    refused(request(Op::Lookup, &[], Some("has space"), Vec::new()), libc::EINVAL);
    assert!(vm.slots.live.lock().unwrap().is_empty());
    vm.stop();
}

/// A host process's named segment, made through the daemon's broker, found by name and attached
/// by a guest at its placement (the owner's pages from the offset), and revoked when the owner
/// removes it.
#[test]
fn a_vm_finds_and_attaches_a_host_process_segment_by_name() {
    let dir = TempDir::new("clowder-xemem-vm-host");
    let links = XememLinks::new();
    let service = clowderd::xemem::service::start(&dir.0.join("xemem.sock")).unwrap();
    service.broker.set_enclaves(links.clone());
    links.set_attachers(service.broker.clone());
    links.set_broker(service.broker.clone());
    let keeper = support_program(&dir.0, "host_keeper");
    let mut host = std::process::Command::new(&keeper)
        .args(["host-made", "0x5000"])
        .env("CLOWDER_XEMEM_SOCKET", &service.socket)
        .env("CLOWDER_XEMEM_BACKEND", "broker")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(host.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(line.starts_with("made a segment of enclave"), "{line}");
    let vm = VmThread::start(&links, fake_ram(4 * MIB, 0xa));
    let [segment, ..] = vm.call(request(Op::Lookup, &[], Some("host-made"), Vec::new())).unwrap();
    let [apid, ..] = vm.call(request(Op::Get, &[segment, xemem::ACCESS_READ_WRITE as u64, 1], None, Vec::new())).unwrap();
    vm.call(Call::Place { apid, offset: 0x1000, len: 0x2000, gpa: WINDOW }).unwrap();
    let live = vm.slots.live.lock().unwrap().clone();
    assert_eq!(live.iter().map(|&(_, gpa, _, first)| (gpa, first[0])).collect::<Vec<_>>(), [(WINDOW, 0x5001)], "{live:x?}");
    // The owner removes it: the VM's slots go (its guest then reads all ones there).
    std::io::Write::write_all(host.stdin.as_mut().unwrap(), b"remove\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(line.starts_with("segid"), "{line}");
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "remove: 0 (errno 0)\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !vm.slots.live.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the attachment outlived the host's segment");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(host.stdin.take());
    host.wait().unwrap();
    vm.stop();
}

/// A VM export of scattered pages (256 one-page runs of its RAM) attached and read by a host
/// process through the broker: its answer carries the VM's RAM once, not once per run (a message
/// holds at most 250 descriptors; the broker used to drop the connection: ECONNRESET).
#[test]
fn a_host_process_attaches_a_scattered_vm_export() {
    let dir = TempDir::new("clowder-xemem-vm-scattered");
    let links = XememLinks::new();
    let service = clowderd::xemem::service::start(&dir.0.join("xemem.sock")).unwrap();
    service.broker.set_enclaves(links.clone());
    links.set_attachers(service.broker.clone());
    links.set_broker(service.broker.clone());
    let vm = VmThread::start(&links, fake_ram(4 * MIB, 0xa));
    let runs: Vec<(u64, u64)> = (0..256).map(|i| ((0x10 + 2 * i) * 4096, 4096)).collect();
    assert_eq!(vm.call(request(Op::Runs, &[0], None, runs)), Ok([0; 4]));
    vm.call(request(Op::Make, &[0x7000_0000, MIB, 1, 0o666, 256], Some("scattered"), Vec::new())).unwrap();
    let bench = dir.0.join("attach_bench");
    cc_against_libxpmem(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../xemem/bench/attach_bench.c"), &bench);
    let out = std::process::Command::new(&bench)
        .args(["attach", "scattered", "1", "2", "1", "attach", "read"])
        .env("CLOWDER_XEMEM_SOCKET", &service.socket)
        .env("CLOWDER_XEMEM_BACKEND", "broker")
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.lines().any(|line| line.starts_with("read 1 1 ")), "{said}");
    vm.stop();
}
