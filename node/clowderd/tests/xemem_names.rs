//! One name space for XEMEM segment names (issue 22, point 4): a name is held by the first
//! segment made with it, whether a host process (the broker), an LWK job (the daemon's node)
//! or a process under a sub-manager daemon made it. The second make of a held name gets
//! EEXIST wherever it comes from, and lookups everywhere find the first holder's segment.
//! Before, the broker and the node kept separate tables: an unprivileged host process could
//! make `cg-solution` first, root's LWK job made it too, and root's host lookup returned the
//! host process's segment.
//!
//! The tree test runs `clowderd` binaries (no KVM); the LWK test needs what `xemem_lwk`
//! needs (/dev/kvm, musl-gcc, the LWK image, clowder-vmm) and is skipped, with the reason,
//! otherwise.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clowderd::client::Client;
use serde_json::json;

mod support;
use support::processes::{daemon_tree, support_program, Daemon, HostProcess};
use support::{
    assert_host_attacher_reads_the_job, create_lwk_enclave, job_test_programs, remove_enclaves, run_job, run_job_to_end,
    start_daemon_with_broker, BrokeredDaemon, TempDir,
};

/// The segids `xemem_ls` at `socket` lists under `name` (every segment of the node's and the
/// broker's name servers).
fn listed(socket: &Path, name: &str) -> Vec<i64> {
    let reply = Client::connect_to(socket).unwrap().call(&json!({"op": "xemem_ls"})).unwrap();
    let segments = reply["segments"].as_array().cloned().unwrap_or_default();
    segments.iter().filter(|s| s["name"] == name).filter_map(|s| s["segid"].as_i64()).collect()
}

/// A host_keeper under `at` holding `name` (pages `base + i`); returns it and its segid.
fn hold(keeper: &Path, at: &Daemon, name: &str, base: u64) -> (HostProcess, i64) {
    let mut holder = HostProcess::spawn(keeper, &at.xemem_socket(), &[name, &base.to_string()]);
    let Some(segid) = holder.wait_for("segid", Duration::from_secs(10)) else {
        let (status, output) = holder.finish(Duration::from_secs(1));
        panic!("{name}: the first make failed ({status:?}): {output}\n{}", at.log());
    };
    (holder, segid.parse().unwrap())
}

/// A second host_keeper making `name` under `at`: it must be refused with EEXIST.
fn refused(keeper: &Path, at: &Daemon, name: &str) {
    let (status, output) = HostProcess::spawn(keeper, &at.xemem_socket(), &[name, "200"]).finish(Duration::from_secs(10));
    assert!(
        output.contains("make failed: errno 17"),
        "{name}: the second make under {} was not refused: {output}\n{}",
        at.dir.display(),
        at.log()
    );
    assert_eq!(status, Some(2), "{output}");
}

/// Host processes under A (the name server), under its sub-managers B and C, and under D
/// (below B): the first make of a name anywhere holds it, the second anywhere else (the same
/// daemon, above, below, beside) is refused, the name server lists it once, and a host
/// process under any daemon that looks it up attaches the first holder's pages.
#[test]
fn a_name_is_held_once_across_a_tree_of_daemons() {
    let dir = TempDir::new("clowderd-xemem-names-tree");
    let keeper = support_program(&dir.0, "host_keeper");
    let cycler = support_program(&dir.0, "host_cycler");
    let (a, [(b, _), (c, _), (d, _)]) = daemon_tree(&dir.0, [("b", "a"), ("c", "a"), ("d", "b")]);
    let cases: [(&Daemon, &Daemon, &Daemon); 6] = [(&a, &a, &d), (&b, &a, &c), (&a, &b, &d), (&b, &c, &a), (&d, &a, &c), (&c, &d, &b)];
    for (i, (first, second, reader)) in cases.into_iter().enumerate() {
        let name = format!("cg-solution-{i}");
        let base = 100 + 1000 * i as u64;
        let (mut holder, segid) = hold(&keeper, first, &name, base);
        refused(&keeper, second, &name);
        assert_eq!(listed(&a.dir.join("clowderd.sock"), &name), [segid], "the name server lists {name} once");
        let read = Command::new(&cycler)
            .args([name.as_str(), &base.to_string()])
            .env("CLOWDER_XEMEM_SOCKET", reader.xemem_socket())
            .output()
            .unwrap();
        let output = String::from_utf8_lossy(&read.stdout);
        assert!(read.status.success() && output.contains("cycled twice"), "{name} from {}: {output}", reader.dir.display());
        holder.tell("remove");
        assert_eq!(holder.wait_for("remove:", Duration::from_secs(10)).as_deref(), Some("0 (errno 0)"), "{:?}", holder.seen);
        // Removed, the name is free again, for anyone.
        let (again, _) = hold(&keeper, second, &name, base);
        drop(again.finish(Duration::from_secs(10)));
    }
}

/// An LWK job and host processes under one daemon: a host process holds `lwk-owner-seg`, and
/// the job's `xemem_make` of it is refused (EEXIST); then the job holds it, a host process's
/// make of it is refused, and a host process that looks it up attaches the job's pages (the
/// job sees its write). `xemem_ls` lists the name once throughout.
#[test]
fn host_processes_and_lwk_jobs_share_one_name_space() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-xemem-names-lwk", "lwk_named_owner", "host_attacher") else { return };
    let keeper = support_program(&dir.0, "host_keeper");
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    let enclave_id = create_lwk_enclave(&socket, "sim", 1, "128M");
    let keep = |name: &str| HostProcess::spawn(&keeper, &xemem_socket, &[name, "100"]);

    // Host first: the job's make is refused.
    let mut holder = keep("lwk-owner-seg");
    let segid: i64 = holder.wait_for("segid", Duration::from_secs(10)).expect("the host process made no segment").parse().unwrap();
    let (reply, stdout) = run_job_to_end(&socket, "sim", &job, &["lwk_named_owner"], &dir.0);
    assert!(stdout.contains("xemem_make failed: errno 17"), "the job's make of a held name: {reply} {stdout}");
    assert_eq!(listed(&socket, "lwk-owner-seg"), [segid]);
    holder.tell("remove");
    assert_eq!(holder.wait_for("remove:", Duration::from_secs(10)).as_deref(), Some("0 (errno 0)"), "{:?}", holder.seen);

    // The job first: a host process's make is refused, and a host lookup finds the job's.
    let job_stdout = std::sync::Mutex::new(String::new());
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job(&socket, "sim", &job, &["lwk_named_owner"], &dir.0, &job_stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        let job_segid = loop {
            if let [segid] = listed(&socket, "lwk-owner-seg")[..] {
                break segid;
            }
            assert!(Instant::now() < deadline, "the job's segment never appeared: {}", job_stdout.lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(job_segid >> 32, enclave_id as i64, "the job's segment names its enclave");
        let (status, output) = keep("lwk-owner-seg").finish(Duration::from_secs(10));
        assert!(output.contains("make failed: errno 17"), "a host make of the job's name: {status:?} {output}");
        assert_eq!(listed(&socket, "lwk-owner-seg"), [job_segid]);
        assert_host_attacher_reads_the_job(&attacher, &xemem_socket, enclave_id, String::new);
        let reply = runner.join().unwrap();
        let stdout = job_stdout.lock().unwrap().clone();
        assert_eq!(reply["status"], 0, "{reply} {stdout}");
        assert!(stdout.contains("the host wrote 42"), "{stdout}");
    });
    remove_enclaves(&socket, &["sim"]);
}
