//! XEMEM crash hygiene (issue 22, point 5): when clowderd dies (SIGKILL), its enclaves' VMMs
//! stop, and a host process attached to an LWK job's segment must not keep reading and writing
//! the dead enclave's RAM, nor pin the RAM's memfd: its library sees the broker's connection
//! close and revokes the attachment itself, so the next touch is SIGBUS and the memfd is no
//! longer mapped. Needs /dev/kvm, musl-gcc, the LWK image and clowder-vmm; skipped, with the
//! reason, otherwise.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use clowderd::client::Client;
use serde_json::json;

mod support;
use support::processes::{Daemon, HostProcess};
use support::{job_test_programs, lwk_xemem_id};

/// What the VMM names an enclave's RAM memfd (`/memfd:clowder-guest-ram` in /proc/PID/maps).
const GUEST_RAM: &str = "memfd:clowder-guest-ram";

fn maps_guest_ram(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains(GUEST_RAM)
}

/// Starts `job` in `enclave` of the daemon at `socket` on a thread of its own; the call ends
/// with an error when the daemon dies, which is what this file's tests do to it.
fn start_job(socket: &Path, enclave: &str, job: &Path, argv: &[&str], cwd: &Path) -> std::thread::JoinHandle<()> {
    let binary = std::fs::File::open(job).unwrap();
    let directory = std::fs::File::open(cwd).unwrap();
    let request = json!({"op": "run", "enclave": enclave, "argv": argv, "cwd": cwd.to_str().unwrap(), "files": []});
    let mut client = Client::connect_to(socket).unwrap();
    std::thread::spawn(move || {
        let _ = client.call_streaming(&request, &[binary.as_raw_fd(), directory.as_raw_fd()], &mut |_| {});
    })
}

#[test]
fn a_host_attacher_of_an_lwk_segment_gets_sigbus_and_lets_go_of_its_ram_when_the_daemon_is_killed() {
    let Some((dir, job, holder)) = job_test_programs("clowderd-xemem-crash", "lwk_named_owner", "host_held_attacher") else { return };
    let mut daemon = Daemon::start_with_machines(&dir.0.join("a"), None);
    let socket = daemon.dir.join("clowderd.sock");
    let created = daemon.call(json!({"op": "create", "name": "sim", "cores": 1, "mem": "128M"}));
    assert_eq!(created["ok"], true, "{created}");
    lwk_xemem_id(&socket, "sim", Duration::from_secs(10)).expect("the enclave got no XEMEM id");
    // The job waits (up to 20 s) for a 42 that never comes, holding its segment.
    let job_call = start_job(&socket, "sim", &job, &["lwk_named_owner"], &dir.0);

    let mut attacher = HostProcess::spawn(&holder, &daemon.xemem_socket(), &["lwk-owner-seg", "1000", "linger"]);
    let attached = attacher.wait_for("attached:", Duration::from_secs(15));
    assert_eq!(attached.as_deref(), Some("page 0 starts with 1000 (expected 1000)"), "{:?}\n{}", attacher.seen, daemon.log());
    let pid = attacher.child.id();
    assert!(maps_guest_ram(pid), "the attacher maps the enclave's RAM while it reads it");

    daemon.child.kill().unwrap();
    let _ = daemon.child.wait();
    let sigbus = attacher.wait_for("SIGBUS after the owner went:", Duration::from_secs(10));
    assert_eq!(sigbus.as_deref(), Some("1"), "the attacher's next touch after the daemon died: {:?}", attacher.seen);
    assert!(!maps_guest_ram(pid), "the attacher still maps the dead enclave's RAM memfd");
    let (status, output) = attacher.finish(Duration::from_secs(5));
    assert_eq!(status, Some(0), "{output}");
    job_call.join().unwrap();
}
