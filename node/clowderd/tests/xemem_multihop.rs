//! XEMEM across two daemons (docs/xemem.md, "Across daemons"): daemon A is the name server;
//! daemon B, started with `--xemem-upstream`, is a sub-manager that gets its enclave id from A
//! over a daemon link. Host processes on either daemon (libxpmem, each against its own daemon's
//! broker) share memory with each other: the owner's very pages, passed as files across the
//! link, never copied. A fake daemon on A's link socket sends malformed messages, bogus
//! descriptors and runs, and A keeps serving.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clowderd::client::Client;
use serde_json::{json, Value};
use xemem::wire::{AttachedPart, Body, FrameRun, Message, Name};
use xemem::NAME_SERVER_ENCLAVE;

mod support;
use support::processes::{daemon_tree, sub_manager, support_program, with_id, Daemon, HostProcess};
use support::{
    assert_host_attacher_reads_the_job, create_lwk_enclave, host_program, job_test_dir, job_test_programs, log_lines, lwk_job,
    regions_added_and_removed, remove_enclaves, run_job_to_end, RevokeRun, TempDir,
};

/// Owner on one daemon, attacher on another: the attacher finds the owner's segment by name,
/// reads the owner's 16 pages, writes what the owner waits for, and gets SIGBUS once the owner
/// removes the segment. Returns the enclave the segid names.
fn share(program: &Path, owner_at: &Daemon, attacher_at: &Daemon, name: &str, base: u64) -> u32 {
    let mut owner = HostProcess::start(program, &owner_at.xemem_socket(), "owner", name, base);
    let enclave = owner.wait_for("made a segment of enclave", Duration::from_secs(10));
    let Some(enclave) = enclave else {
        let (status, output) = owner.finish(Duration::from_secs(1));
        panic!("the owner made no segment ({status:?}): {output}\nowner's daemon: {}", owner_at.log());
    };
    let enclave: u32 = enclave.parse().unwrap();
    let attacher = HostProcess::start(program, &attacher_at.xemem_socket(), "attacher", name, base);
    let (attacher_status, attacher_output) = attacher.finish(Duration::from_secs(40));
    let (owner_status, owner_output) = owner.finish(Duration::from_secs(10));
    let context = format!(
        "attacher ({attacher_status:?}):\n{attacher_output}\nowner ({owner_status:?}):\n{owner_output}\nowner's daemon:\n{}\nattacher's daemon:\n{}",
        owner_at.log(),
        attacher_at.log()
    );
    assert!(attacher_output.contains(&format!("found a segment of enclave {enclave}")), "{context}");
    assert!(attacher_output.contains("16 of 16 pages hold what the owner wrote"), "{context}");
    assert!(owner_output.contains("the attacher wrote 43 and 7"), "{context}");
    assert!(owner_output.contains("remove: 0"), "{context}");
    assert!(owner_output.contains("16 of 16 pages intact after remove"), "{context}");
    assert!(attacher_output.contains("SIGBUS after remove"), "{context}");
    assert_eq!(attacher_status, Some(0), "{context}");
    assert_eq!(owner_status, Some(0), "{context}");
    enclave
}

#[test]
fn host_processes_under_two_daemons_share_memory_both_ways() {
    let dir = TempDir::new("clowderd-multihop-share");
    let program = host_program(&dir.0, "host_peer");
    let (a, [(b, b_id)]) = daemon_tree(&dir.0, [("b", "a")]);
    assert!(b_id >= 2, "enclave 1 is the name server: {b_id}");
    assert!(a.wait_for_log("linked to a daemon below", Duration::from_secs(1)).is_some(), "{}", a.log());

    // B's host process owns, A's attaches: the segid names B's enclave.
    assert_eq!(share(&program, &b, &a, "multihop-b-to-a", 3000), b_id);
    // A's host process owns, B's attaches: the segid names the name server's enclave.
    assert_eq!(share(&program, &a, &b, "multihop-a-to-b", 5000), NAME_SERVER_ENCLAVE);
    // Both under B: the request goes through A's name server and back, the memory stays B's.
    assert_eq!(share(&program, &b, &b, "multihop-b-to-b", 7000), b_id);

    // B goes away: A's name server forgets B's segments.
    let mut lingering = HostProcess::start(&program, &b.xemem_socket(), "owner", "multihop-lingering", 100);
    assert!(lingering.wait_for("made a segment of enclave", Duration::from_secs(10)).is_some());
    assert!(a.segment_names().contains(&"multihop-lingering".to_string()), "{:?}", a.segment_names());
    drop(b);
    assert!(a.wait_for_log("the link to a daemon below is down", Duration::from_secs(5)).is_some(), "{}", a.log());
    assert!(!a.segment_names().contains(&"multihop-lingering".to_string()), "{:?}", a.segment_names());
    let _ = lingering.finish(Duration::from_millis(10));
    // A still serves its own host processes, and links a new sub-manager.
    let (b2, _) = sub_manager(&dir.0.join("b"), &a);
    share(&program, &b2, &a, "multihop-again", 9000);
}

/// Two sub-managers of one name server: a host process under B shares memory with one under
/// C. The attach goes C -> A (name server) -> B (owner), and the owner's memfd goes back
/// B -> A -> C as a descriptor at each hop.
#[test]
fn host_processes_under_sibling_sub_managers_share_memory() {
    let dir = TempDir::new("clowderd-multihop-siblings");
    let program = host_program(&dir.0, "host_peer");
    let (_a, [(b, b_id), (c, c_id)]) = daemon_tree(&dir.0, [("b", "a"), ("c", "a")]);
    assert_ne!(b_id, c_id);
    assert_eq!(share(&program, &b, &c, "multihop-b-to-c", 4000), b_id);
    assert_eq!(share(&program, &c, &b, "multihop-c-to-b", 6000), c_id);
}

/// A sub-manager of a sub-manager: D links to B, B to A. D's host segments are registered at
/// A's name server through B; A's host processes attach them (the owner's memfd crosses
/// D -> B -> A: B passes D's answer on as files), and D's host processes attach A's. (B's
/// own host processes cannot attach D's segments yet: see docs/xemem.md, "Limits".)
#[test]
fn host_processes_two_daemons_apart_share_memory() {
    let dir = TempDir::new("clowderd-multihop-deep");
    let program = host_program(&dir.0, "host_peer");
    let (a, [(_b, _), (d, d_id)]) = daemon_tree(&dir.0, [("b", "a"), ("d", "b")]);
    assert_eq!(share(&program, &d, &a, "multihop-d-to-a", 8000), d_id);
    assert_eq!(share(&program, &a, &d, "multihop-a-to-d", 8200), NAME_SERVER_ENCLAVE);
}

/// The tree the LWK tests deep in it use: A the name server, B and C its sub-managers, D under
/// B running LWK enclave `enclave` (created here); returns the daemons and the enclave's XEMEM
/// id.
fn tree_with_an_enclave_under_d(dir: &Path, enclave: &str) -> (Daemon, Daemon, Daemon, Daemon, u32) {
    let (a, [(b, _), (c, _)]) = daemon_tree(dir, [("b", "a"), ("c", "a")]);
    let d = enclave_sub_manager(&dir.join("d"), &b);
    let id = create_lwk_enclave(&d.socket(), enclave, 1, "128M");
    (a, b, c, d, id)
}

/// [`sub_manager`] that runs LWK enclaves too.
fn enclave_sub_manager(dir: &Path, upstream: &Daemon) -> Daemon {
    with_id(Daemon::start_with_machines(dir, Some(upstream)), upstream).0
}

/// Any tree of daemons: A is the name server, B and C its sub-managers, D under B and E under
/// D. A host process under any of them attaches segments owned one and two levels below its
/// own daemon (the owner answers it directly, not through a bridge above), above it, and in
/// the sibling subtree, always mapping the owner's own pages.
#[test]
fn host_processes_anywhere_in_a_tree_of_daemons_share_memory() {
    let dir = TempDir::new("clowderd-multihop-tree");
    let program = host_program(&dir.0, "host_peer");
    let (a, [(b, b_id), (c, c_id), (d, d_id), (e, e_id)]) = daemon_tree(&dir.0, [("b", "a"), ("c", "a"), ("d", "b"), ("e", "d")]);
    let mut ids = vec![b_id, c_id, d_id, e_id];
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "{b_id} {c_id} {d_id} {e_id}");
    // One level below the attacher's daemon, then two.
    assert_eq!(share(&program, &d, &b, "tree-d-to-b", 1000), d_id);
    assert_eq!(share(&program, &e, &b, "tree-e-to-b", 1200), e_id);
    assert_eq!(share(&program, &e, &d, "tree-e-to-d", 1400), e_id);
    assert_eq!(share(&program, &e, &a, "tree-e-to-a", 1600), e_id);
    // Above: two levels up, and the name server's daemon.
    assert_eq!(share(&program, &b, &e, "tree-b-to-e", 1800), b_id);
    assert_eq!(share(&program, &a, &e, "tree-a-to-e", 2000), NAME_SERVER_ENCLAVE);
    // Across subtrees, both ways, three hops down on one side.
    assert_eq!(share(&program, &e, &c, "tree-e-to-c", 2200), e_id);
    assert_eq!(share(&program, &c, &e, "tree-c-to-e", 2400), c_id);
    assert_eq!(share(&program, &d, &c, "tree-d-to-c", 2600), d_id);
    // Owner and attacher under one daemon deep in the tree.
    assert_eq!(share(&program, &e, &e, "tree-e-to-e", 2800), e_id);
    // The whole life of a permit, twice (get, attach, detach, release), from every daemon on
    // segments two levels below, beside and above.
    let keeper = support_program(&dir.0, "host_keeper");
    let cycler = support_program(&dir.0, "host_cycler");
    for (owner_at, attachers, name, base) in [
        (&e, [&a, &b, &c, &d, &e], "cycle-e", 3000u64),
        (&c, [&a, &b, &c, &d, &e], "cycle-c", 3200),
        (&b, [&a, &b, &c, &d, &e], "cycle-b", 3400),
    ] {
        let mut owner = HostProcess::owner(&keeper, &owner_at.xemem_socket(), &[name, &base.to_string()]);
        for attacher_at in attachers {
            let cycled = Command::new(&cycler)
                .args([name, &base.to_string()])
                .env("CLOWDER_XEMEM_SOCKET", attacher_at.xemem_socket())
                .output()
                .unwrap();
            let output = String::from_utf8_lossy(&cycled.stdout);
            assert!(
                cycled.status.success() && output.contains("cycled twice"),
                "{name} from {}: {output}\nowner's daemon:\n{}",
                attacher_at.dir.display(),
                owner_at.log()
            );
        }
        owner.tell("remove");
        assert_eq!(owner.wait_for("remove:", Duration::from_secs(10)).as_deref(), Some("0 (errno 0)"), "{:?}", owner.seen);
        let _ = owner.finish(Duration::from_secs(5));
    }
    // An owner's remove revokes a permit the name server granted two daemons down (D holds
    // one on E's segment): D's acknowledgement comes back through B, so the remove does not
    // wait for the revocation deadline (2 s). (Were it lost, the remove would still be done
    // by the owner's retry half a second later, once D's attacher, dead of SIGBUS, released
    // its permit: this bound catches only the deadline.)
    let (mut owner, attacher) = kept_and_attached(&keeper, &program, &e, &d, "tree-ack", 3600);
    let started = Instant::now();
    owner.tell("remove");
    assert_eq!(owner.wait_for("remove:", Duration::from_secs(10)).as_deref(), Some("0 (errno 0)"), "{:?}", owner.seen);
    let took = started.elapsed();
    let (_, output) = attacher.finish(Duration::from_secs(10));
    assert!(output.contains("SIGBUS after remove"), "{output}");
    assert!(took < Duration::from_millis(1500), "the remove took {took:?}\nA:\n{}\nB:\n{}", a.log(), b.log());
    let _ = owner.finish(Duration::from_secs(5));
    // Every daemon still answers.
    for daemon in [&a, &b, &c, &d, &e] {
        assert_eq!(daemon.call(json!({"op": "ls"}))["ok"], true, "{}", daemon.log());
    }
}

/// Two sibling sub-managers' host processes attach each other's segments at the same time:
/// the name server's daemon bridges both, and neither bridged attach may hold up the link
/// the other's answer comes back on.
#[test]
fn sibling_sub_managers_attach_each_others_segments_at_once() {
    let dir = TempDir::new("clowderd-multihop-crossing");
    let program = host_program(&dir.0, "host_peer");
    let (_a, [(b, b_id), (c, c_id)]) = daemon_tree(&dir.0, [("b", "a"), ("c", "a")]);
    for round in 0..3u64 {
        std::thread::scope(|scope| {
            let one = scope.spawn(|| share(&program, &b, &c, &format!("crossing-b-{round}"), 3000 + round * 100));
            let other = scope.spawn(|| share(&program, &c, &b, &format!("crossing-c-{round}"), 5000 + round * 100));
            assert_eq!(one.join().unwrap(), b_id);
            assert_eq!(other.join().unwrap(), c_id);
        });
    }
}

/// A host owner under `owner_at` that never removes its segment, and a host_peer attacher
/// under `attacher_at` that has read its pages and now touches them until SIGBUS.
fn kept_and_attached(
    keeper: &Path,
    program: &Path,
    owner_at: &Daemon,
    attacher_at: &Daemon,
    name: &str,
    base: u64,
) -> (HostProcess, HostProcess) {
    let owner = HostProcess::owner(keeper, &owner_at.xemem_socket(), &[name, &base.to_string()]);
    let mut attacher = HostProcess::start(program, &attacher_at.xemem_socket(), "attacher", name, base);
    let wrote = attacher.wait_for("wrote 43", Duration::from_secs(20));
    assert!(wrote.is_some(), "{:?}\nowner's daemon:\n{}\nattacher's daemon:\n{}", attacher.seen, owner_at.log(), attacher_at.log());
    assert!(attacher.seen.iter().any(|l| l == "16 of 16 pages hold what the owner wrote"), "{:?}", attacher.seen);
    (owner, attacher)
}

/// A sub-manager dies (SIGKILL): B, with D below it, under A, and C a sibling of B. Host
/// processes on A and C attached segments of host owners on B and on D. The owners live on,
/// but nothing is left to truncate their memory: the daemons that stay revoke the attachments
/// (SIGBUS, as for a crashed enclave's attachers), the name server forgets the segments, and A
/// and C go on sharing memory.
#[test]
fn a_dead_sub_managers_segments_are_revoked_and_removed_elsewhere() {
    let dir = TempDir::new("clowderd-multihop-dead");
    let program = host_program(&dir.0, "host_peer");
    let keeper = support_program(&dir.0, "host_keeper");
    let (a, [(mut b, _), (c, _), (d, _)]) = daemon_tree(&dir.0, [("b", "a"), ("c", "a"), ("d", "b")]);
    let mut kept = Vec::new();
    for (owner_at, owner_name) in [(&b, "b"), (&d, "d")] {
        for (attacher_at, attacher_name) in [(&a, "a"), (&c, "c")] {
            let name = format!("dead-{owner_name}-to-{attacher_name}");
            let base = 1000 * (kept.len() as u64 + 1);
            kept.push((name.clone(), kept_and_attached(&keeper, &program, owner_at, attacher_at, &name, base)));
        }
    }
    let names = a.segment_names();
    assert!(kept.iter().all(|(name, _)| names.contains(name)), "{names:?}");
    b.child.kill().unwrap();
    let _ = b.child.wait();
    assert!(a.wait_for_log("the link to a daemon below is down", Duration::from_secs(5)).is_some(), "{}", a.log());
    for (name, (owner, attacher)) in kept {
        let (status, output) = attacher.finish(Duration::from_secs(15));
        assert!(output.contains("SIGBUS after remove"), "{name}: {status:?} {output}\nA:\n{}\nC:\n{}", a.log(), c.log());
        assert_eq!(status, Some(0), "{name}: {output}");
        let _ = owner.finish(Duration::from_millis(10));
    }
    let names = a.segment_names();
    assert!(!names.iter().any(|name| name.starts_with("dead-")), "{names:?}");
    // The others keep working: A and C share memory both ways, D still answers.
    share(&program, &c, &a, "after-dead-c-to-a", 9000);
    share(&program, &a, &c, "after-dead-a-to-c", 9200);
    assert_eq!(d.call(json!({"op": "ls"}))["ok"], true, "{}", d.log());

    // A sub-manager dies below one that lives: E under C. C tells the name server, whose
    // daemon revokes its host process's attachment of E's segment.
    let (mut e, _) = sub_manager(&dir.0.join("e"), &c);
    let (owner, attacher) = kept_and_attached(&keeper, &program, &e, &a, "dead-e-to-a", 9400);
    e.child.kill().unwrap();
    let _ = e.child.wait();
    let (status, output) = attacher.finish(Duration::from_secs(15));
    assert!(output.contains("SIGBUS after remove"), "{status:?} {output}\nA:\n{}\nC:\n{}", a.log(), c.log());
    let _ = owner.finish(Duration::from_millis(10));
    assert!(!a.segment_names().contains(&"dead-e-to-a".to_string()), "{:?}", a.segment_names());
    share(&program, &c, &a, "after-dead-e", 9600);
}

/// The enclave ids `daemon` has logged getting, oldest first.
fn ids_logged(daemon: &Daemon) -> Vec<u32> {
    const LINE: &str = "the name server gave this daemon enclave id ";
    daemon.log().lines().filter_map(|l| l.find(LINE).map(|at| l[at + LINE.len()..].trim().parse().unwrap())).collect()
}

/// Waits until `daemon` logs an id after its `before`-th one; returns it.
fn new_id(daemon: &Daemon, before: usize, timeout: Duration) -> Option<u32> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let ids = ids_logged(daemon);
        if ids.len() > before {
            return ids.last().copied();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The name server's daemon restarts under its sub-managers (B under A, D under B). B links
/// to the new A again (with backoff), unlinks D so that D links again too, and both get new
/// ids from the new name server. Segments made under them before are gone cleanly: their
/// attachers under B and D get SIGBUS, the owner's remove succeeds, the new name server does
/// not know them, and new segments are shared across all three daemons.
#[test]
fn sub_managers_link_again_to_a_restarted_upstream_daemon() {
    let dir = TempDir::new("clowderd-multihop-relink");
    let program = host_program(&dir.0, "host_peer");
    let keeper = support_program(&dir.0, "host_keeper");
    let (a, [(b, b_id), (d, d_id)]) = daemon_tree(&dir.0, [("b", "a"), ("d", "b")]);
    let kept = vec![
        ("relink-b-to-b", kept_and_attached(&keeper, &program, &b, &b, "relink-b-to-b", 1000)),
        ("relink-d-to-b", kept_and_attached(&keeper, &program, &d, &b, "relink-d-to-b", 2000)),
        ("relink-d-to-d", kept_and_attached(&keeper, &program, &d, &d, "relink-d-to-d", 3000)),
    ];
    let (b_ids, d_ids) = (ids_logged(&b).len(), ids_logged(&d).len());
    drop(a);
    let a = Daemon::start(&dir.0.join("a"), None);
    let b_again = new_id(&b, b_ids, Duration::from_secs(20)).unwrap_or_else(|| panic!("B got no new id:\n{}\nA:\n{}", b.log(), a.log()));
    let d_again = new_id(&d, d_ids, Duration::from_secs(20)).unwrap_or_else(|| panic!("D got no new id:\n{}\nB:\n{}", d.log(), b.log()));
    assert!(b.log().contains("linking to the upstream daemon again"), "{}", b.log());
    assert_ne!(b_again, d_again);
    eprintln!("ids before {b_id} {d_id}, after {b_again} {d_again}");
    for (name, (mut owner, attacher)) in kept {
        let (status, output) = attacher.finish(Duration::from_secs(15));
        assert!(output.contains("SIGBUS after remove"), "{name}: {status:?} {output}\nB:\n{}\nD:\n{}", b.log(), d.log());
        // Its permit went with the old name server: the detach and then the release of it
        // succeed on the attacher's daemon, as XPMEM's clean-up expects.
        assert!(output.contains("detach: 0 (errno 0)\nrelease: 0 (errno 0)"), "{name}: {output}");
        owner.tell("remove");
        let removed = owner.wait_for("remove:", Duration::from_secs(10));
        assert_eq!(removed.as_deref(), Some("0 (errno 0)"), "{name}: {:?}", owner.seen);
        let _ = owner.finish(Duration::from_secs(5));
    }
    assert!(a.segment_names().is_empty(), "{:?}", a.segment_names());
    assert_eq!(share(&program, &b, &a, "relinked-b-to-a", 4000), b_again);
    assert_eq!(share(&program, &a, &b, "relinked-a-to-b", 4200), NAME_SERVER_ENCLAVE);
    assert_eq!(share(&program, &d, &b, "relinked-d-to-b", 4400), d_again);
    assert_eq!(share(&program, &d, &a, "relinked-d-to-a", 4600), d_again);
    assert_eq!(share(&program, &b, &d, "relinked-b-to-d", 4800), b_again);
}

/// The name server's daemon restarts while a host process holds a segid from before. After
/// the restart a new segment is made, and the old segid does not reach it: the new daemon's
/// ids start elsewhere, so the old one gets ENOENT, as a removed segment's does.
#[test]
fn a_segid_from_before_a_daemon_restart_is_not_found_after_it() {
    let dir = TempDir::new("clowderd-multihop-stale");
    let keeper = support_program(&dir.0, "host_keeper");
    let attacher = host_program(&dir.0, "host_segid_attacher");
    let a = Daemon::start(&dir.0.join("a"), None);
    let mut before = HostProcess::spawn(&keeper, &a.xemem_socket(), &["stale-before", "1000"]);
    let old_segid = before.wait_for("segid", Duration::from_secs(10)).unwrap_or_else(|| panic!("{:?}\n{}", before.seen, a.log()));
    drop(a);
    let _ = before.finish(Duration::from_secs(5));
    let a = Daemon::start(&dir.0.join("a"), None);
    // Pages as host_segid_attacher expects them: were the old segid to reach this segment, the
    // attacher would say so.
    let mut after = HostProcess::spawn(&keeper, &a.xemem_socket(), &["stale-after", "5000"]);
    let new_segid = after.wait_for("segid", Duration::from_secs(10)).unwrap_or_else(|| panic!("{:?}\n{}", after.seen, a.log()));
    let (status, output) = HostProcess::spawn(&attacher, &a.xemem_socket(), &[&old_segid]).finish(Duration::from_secs(10));
    assert_eq!((status, output.as_str()), (Some(2), "get failed: errno 2"), "old segid {old_segid}, new {new_segid}\n{}", a.log());
    let _ = after.finish(Duration::from_secs(5));
}

/// XEMEM's signals to host owners under sub-managers: xemem/tests/notify_peer.c, each party
/// the owner of one named segment and a permit holder on the other's. The "wait" party blocks
/// on its notify descriptor until the other signals it, then signals back; the "signal"
/// party polls its descriptor. Pairs across the tree A <- B <- D, A <- C: D with C (three
/// daemons apart, through the name server's daemon), D with B (the owner below), B with A.
#[test]
fn host_owners_under_sub_managers_get_signals_from_anywhere_in_the_tree() {
    let dir = TempDir::new("clowderd-multihop-signals");
    let program = host_program(&dir.0, "notify_peer");
    let (a, [(b, _), (c, _), (d, _)]) = daemon_tree(&dir.0, [("b", "a"), ("c", "a"), ("d", "b")]);
    for (waiter_at, signaller_at, tag) in
        [(&d, &c, "d-c"), (&c, &d, "c-d"), (&d, &b, "d-b"), (&b, &d, "b-d"), (&b, &a, "b-a"), (&a, &b, "a-b")]
    {
        let (own, peer) = (format!("notify-{tag}-waiter"), format!("notify-{tag}-signaller"));
        let mut waiter = HostProcess::spawn(&program, &waiter_at.xemem_socket(), &[&own, &peer, "wait"]);
        assert!(waiter.wait_for("made", Duration::from_secs(10)).is_some(), "{tag}: {:?}", waiter.seen);
        let signaller = HostProcess::spawn(&program, &signaller_at.xemem_socket(), &[&peer, &own, "signal"]);
        let (signaller_status, signaller_output) = signaller.finish(Duration::from_secs(30));
        let (waiter_status, waiter_output) = waiter.finish(Duration::from_secs(10));
        let context = format!(
            "{tag}\nwaiter ({waiter_status:?}):\n{waiter_output}\nsignaller ({signaller_status:?}):\n{signaller_output}\nA:\n{}\nB:\n{}",
            a.log(),
            b.log()
        );
        assert!(waiter_output.contains("woke 1") && waiter_output.contains(&format!("signalled {peer}")), "{context}");
        assert!(signaller_output.contains("polled readable") && signaller_output.contains("woke 1"), "{context}");
        assert_eq!((waiter_status, signaller_status), (Some(0), Some(0)), "{context}");
    }
}

/// A fake sub-manager on A's daemon-link socket.
struct FakePeer {
    socket: OwnedFd,
    id: u32,
}

impl FakePeer {
    fn link(a: &Daemon) -> FakePeer {
        // The daemon-link socket is bound just after the API socket answers.
        let deadline = Instant::now() + Duration::from_secs(5);
        let socket = loop {
            match clowderd::sys::connect(&a.dir.join("xemem-peer.sock")) {
                Ok(socket) => break socket,
                Err(e) => assert!(Instant::now() < deadline, "linking to A: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut peer = FakePeer { socket, id: 0 };
        peer.send(&Message::new(0, 0, 0, Body::PingNameServer), &[]);
        assert!(matches!(peer.receive().map(|m| m.body), Some(Body::PongNameServer)));
        peer.send(&Message::new(0, 0, 0, Body::EnclaveIdRequest { token: 7 }), &[]);
        match peer.receive().map(|m| m.body) {
            Some(Body::EnclaveIdResponse { token: 7, enclave }) => peer.id = enclave,
            other => panic!("no enclave id: {other:?}"),
        }
        peer
    }

    fn send(&self, message: &Message, fds: &[&dyn AsFd]) {
        self.send_bytes(&message.to_bytes().unwrap(), fds);
    }

    fn send_bytes(&self, bytes: &[u8], fds: &[&dyn AsFd]) {
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        clowderd::sys::send(&self.socket, bytes, &borrowed).unwrap();
    }

    /// The name server's next `Serve` for a request it has not sent before (retries of an
    /// earlier attach repeat theirs).
    fn next_serve(&self, after: &mut u64) -> Option<Message> {
        loop {
            match self.receive()? {
                message @ Message { body: Body::Serve { .. }, .. } if message.header.request > *after => {
                    *after = message.header.request;
                    return Some(message);
                }
                _ => continue,
            }
        }
    }

    /// Plays the name server's daemon for a sub-manager that links to `listener`: answers its
    /// discovery and gives it enclave id `id`.
    fn upstream_of(listener: &OwnedFd, id: u32) -> FakePeer {
        assert!(clowderd::sys::wait_readable(listener, Duration::from_secs(15)).unwrap(), "the sub-manager did not link");
        let peer = FakePeer { socket: clowderd::sys::accept(listener).unwrap(), id };
        let mut buffer = vec![0u8; 70000];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "no discovery from the sub-manager");
            if !clowderd::sys::wait_readable(&peer.socket, Duration::from_millis(100)).unwrap() {
                continue;
            }
            let (length, _) = clowderd::sys::receive(&peer.socket, &mut buffer).unwrap();
            match Message::decode(&buffer[..length]).map(|m| m.body) {
                Ok(Body::PingNameServer) => peer.send(&Message::new(0, 0, 0, Body::PongNameServer), &[]),
                Ok(Body::EnclaveIdRequest { token }) => {
                    peer.send(&Message::new(0, 0, 0, Body::EnclaveIdResponse { token, enclave: id }), &[]);
                    return peer;
                }
                _ => {}
            }
        }
    }

    /// The next message (skipping discovery chatter), or None after 5 s.
    fn receive(&self) -> Option<Message> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buffer = vec![0u8; 70000];
        while Instant::now() < deadline {
            if !clowderd::sys::wait_readable(&self.socket, Duration::from_millis(100)).unwrap() {
                continue;
            }
            let (length, _fds) = clowderd::sys::receive(&self.socket, &mut buffer).unwrap();
            assert!(length > 0, "A closed the link");
            let message = Message::decode(&buffer[..length]).unwrap();
            if !matches!(message.body, Body::PingNameServer) {
                return Some(message);
            }
        }
        None
    }
}

fn memfd(pages: u64) -> File {
    let file = clowderd::sys::memfd("multihop-test").unwrap();
    file.set_len(pages * 4096).unwrap();
    file
}

#[test]
fn a_malformed_peer_gets_errors_and_the_daemon_keeps_serving() {
    let dir = TempDir::new("clowderd-multihop-malformed");
    let program = host_program(&dir.0, "host_peer");
    let a = Daemon::start(&dir.0, None);
    let peer = FakePeer::link(&a);
    assert!(peer.id >= 2);

    // Garbage, a short header, and a request with a bad body from the peer's enclave.
    peer.send_bytes(b"not a message at all", &[]);
    peer.send_bytes(&[1, 0, 0], &[]);
    let mut bad = Message::new(41, peer.id, NAME_SERVER_ENCLAVE, Body::Lookup { name: Name::new(b"x").unwrap() }).to_bytes().unwrap();
    bad.push(0); // a trailing byte
    peer.send_bytes(&bad, &[]);
    let answer = peer.receive().expect("an answer to the malformed request");
    assert_eq!((answer.header.request, answer.body), (41, Body::Failed { error: xemem::Error::Malformed }));
    // A request in another enclave's name is dropped; one in its own is answered.
    peer.send(&Message::new(42, peer.id + 100, NAME_SERVER_ENCLAVE, Body::Lookup { name: Name::new(b"x").unwrap() }), &[]);
    peer.send(&Message::new(43, peer.id, NAME_SERVER_ENCLAVE, Body::Lookup { name: Name::new(b"x").unwrap() }), &[]);
    let answer = peer.receive().unwrap();
    assert_eq!((answer.header.request, answer.body), (43, Body::Failed { error: xemem::Error::NotFound }));

    // Notices of enclaves that are not behind it going away change nothing; a burst of gets
    // of another enclave's segment (served by the bridge, off the link's thread, a bounded
    // number at once) are each answered: NotFound, or Exhausted while the bridge is busy.
    peer.send(&Message::new(0, peer.id, NAME_SERVER_ENCLAVE, Body::EnclaveGone { enclave: NAME_SERVER_ENCLAVE }), &[]);
    peer.send(&Message::new(0, peer.id, NAME_SERVER_ENCLAVE, Body::EnclaveGone { enclave: peer.id + 1 }), &[]);
    let foreign = xemem::SegmentId::new(peer.id + 1, 1).unwrap();
    for request in 0..200u64 {
        let get = Body::Get { process: 1, segment: foreign, access: xemem::ACCESS_READ_WRITE, uid: 0, groups: vec![0] };
        peer.send(&Message::new(1000 + request, peer.id, NAME_SERVER_ENCLAVE, get), &[]);
    }
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 200 {
        let answer = peer.receive().unwrap_or_else(|| panic!("{} of 200 gets answered: {}", answered.len(), a.log()));
        let busy = answer.body == Body::Failed { error: xemem::Error::Exhausted };
        assert!(busy || answer.body == Body::Failed { error: xemem::Error::NotFound }, "{answer:?}");
        answered.insert(answer.header.request);
    }
    // A retry of one refused while busy is served.
    let get = Body::Get { process: 1, segment: foreign, access: xemem::ACCESS_READ_WRITE, uid: 0, groups: vec![0] };
    peer.send(&Message::new(1199, peer.id, NAME_SERVER_ENCLAVE, get), &[]);
    let answer = peer.receive().expect("an answer to the retry");
    assert_eq!((answer.header.request, answer.body), (1199, Body::Failed { error: xemem::Error::NotFound }));
    assert_eq!(a.call(json!({"op": "ls"}))["ok"], true);

    // The fake daemon exports 16 pages; a host process on A attaches them. The first attaches
    // are answered with bogus memory, each of which must fail the attach, not the daemon.
    let make = Body::Make {
        process: 1,
        vaddr: 0x10000,
        size: 16 * 4096,
        uid: 0,
        gid: 0,
        mode: 0o666,
        name: Some(Name::new(b"fake-peer-seg").unwrap()),
    };
    peer.send(&Message::new(44, peer.id, NAME_SERVER_ENCLAVE, make), &[]);
    let segment = match peer.receive().map(|m| m.body) {
        Some(Body::Made { segment }) => segment,
        other => panic!("make: {other:?}"),
    };
    assert_eq!(segment.enclave(), peer.id);
    let memory = memfd(16);
    for page in 0..16u64 {
        memory.write_all_at_page(page, 11000 + page);
    }
    let (socket_a, _socket_b) = std::os::unix::net::UnixStream::pair().unwrap();
    let small = memfd(4);
    type Bogus<'a> = (&'a str, Vec<FrameRun>, Vec<&'a dyn AsFd>);
    let run = |index: u64, page: u64, frames: u64| FrameRun { first: Some(index << clowderd::xemem::peer::FD_SHIFT | page), frames };
    let bogus: Vec<Bogus> = vec![
        ("a socket for memory", vec![run(0, 0, 16)], vec![&socket_a]),
        ("runs beyond the file", vec![run(0, 0, 16)], vec![&small]),
        ("no descriptor for the run", vec![run(1, 0, 16)], vec![&memory]),
        ("no descriptor at all", vec![run(0, 0, 16)], vec![]),
        ("too few pages", vec![run(0, 0, 15)], vec![&memory]),
    ];
    let mut last_serve = 0;
    for (what, runs, fds) in bogus {
        let mut attacher = HostProcess::start(&program, &a.xemem_socket(), "attacher", "fake-peer-seg", 11000);
        let serve = peer.next_serve(&mut last_serve).unwrap_or_else(|| panic!("{what}: no Serve came: {}", a.log()));
        let Body::Serve { requester, segment: served, size, .. } = serve.body else { unreachable!() };
        assert_eq!((served, size), (segment, 16 * 4096));
        let total_runs = runs.len() as u32;
        let answer = Message::new(
            serve.header.request,
            peer.id,
            requester,
            Body::Attached(AttachedPart { segment, size, first_run: 0, total_runs, runs, valid_while: None }),
        );
        peer.send(&answer, &fds);
        let failed = attacher.wait_for("attach failed", Duration::from_secs(10));
        let (_, output) = attacher.finish(Duration::from_secs(1));
        assert!(failed.is_some(), "{what}: {output}\n{}", a.log());
        assert_eq!(a.call(json!({"op": "ls"}))["ok"], true, "{what}");
    }

    // Now the real thing: the host process maps the fake daemon's memfd, no copy.
    let mut attacher = HostProcess::start(&program, &a.xemem_socket(), "attacher", "fake-peer-seg", 11000);
    let serve = peer.next_serve(&mut last_serve).unwrap_or_else(|| panic!("no Serve came: {}", a.log()));
    let Body::Serve { requester, .. } = serve.body else { unreachable!() };
    let runs = vec![run(0, 0, 16)];
    let answer = Message::new(
        serve.header.request,
        peer.id,
        requester,
        Body::Attached(AttachedPart { segment, size: 16 * 4096, first_run: 0, total_runs: 1, runs, valid_while: None }),
    );
    peer.send(&answer, &[&memory]);
    let wrote = attacher.wait_for("wrote 43", Duration::from_secs(10));
    assert!(wrote.is_some(), "{:?}\n{}", attacher.seen, a.log());
    assert!(attacher.seen.iter().any(|l| l == "16 of 16 pages hold what the owner wrote"), "{:?}", attacher.seen);
    assert_eq!(memory.read_page_word(0, 1), 43, "the attacher's write is in the peer's own memfd");
    assert_eq!(memory.read_page_word(15, 2), 7);
    // Truncating the memory (what an owner's remove does) gives the attacher SIGBUS.
    memory.set_len(0).unwrap();
    let (status, output) = attacher.finish(Duration::from_secs(10));
    assert!(output.contains("SIGBUS after remove"), "{output}");
    assert_eq!(status, Some(0), "{output}");

    // The fake daemon goes away: A forgets its segment and still serves.
    assert!(a.segment_names().contains(&"fake-peer-seg".to_string()));
    drop(peer);
    assert!(a.wait_for_log("the link to a daemon below is down", Duration::from_secs(5)).is_some(), "{}", a.log());
    assert!(!a.segment_names().contains(&"fake-peer-seg".to_string()), "{:?}", a.segment_names());
}

/// A fake name server's daemon above a real sub-manager B sends what a broken or hostile
/// upstream could: garbage, signals and revokes for segments and permits B never had, serves
/// of unknown segments, notices for other enclaves, a flood of signals, a second answer to
/// discovery, and at last a notice that B's own id is gone (B rejoins). B answers what asks
/// for an answer, ignores the rest, keeps serving its API, and links again when the fake
/// daemon hangs up.
#[test]
fn a_sub_manager_survives_a_malformed_upstream_and_links_again() {
    let dir = TempDir::new("clowderd-multihop-bad-upstream");
    std::fs::create_dir_all(dir.0.join("fake")).unwrap();
    let path = dir.0.join("fake/xemem-peer.sock");
    let listener = clowderd::sys::listen(&path).unwrap();
    let b = Daemon::start_with(
        &dir.0.join("b"),
        None,
        &["--kernel", env!("CARGO_BIN_EXE_clowderd"), "--xemem-upstream", path.to_str().unwrap()],
    );
    let up = FakePeer::upstream_of(&listener, 7);
    assert!(b.wait_for_log("the name server gave this daemon enclave id 7", Duration::from_secs(5)).is_some(), "{}", b.log());
    let segment = xemem::SegmentId::new(7, 1).unwrap();
    let access = xemem::AccessId::new(NAME_SERVER_ENCLAVE, 5).unwrap();
    up.send_bytes(b"garbage", &[]);
    up.send_bytes(&[1, 2, 3], &[]);
    up.send(&Message::new(0, 0, 0, Body::PongNameServer), &[]);
    up.send(&Message::new(0, 0, 0, Body::EnclaveIdResponse { token: 999, enclave: 9 }), &[]);
    up.send(&Message::new(1, NAME_SERVER_ENCLAVE, 7, Body::Notify { owner_process: 1, segment }), &[]);
    let elsewhere = xemem::SegmentId::new(9, 1).unwrap();
    up.send(&Message::new(2, NAME_SERVER_ENCLAVE, 7, Body::Notify { owner_process: 1, segment: elsewhere }), &[]);
    up.send(&Message::new(3, NAME_SERVER_ENCLAVE, 7, Body::EnclaveGone { enclave: 9 }), &[]);
    for request in 0..3000u64 {
        up.send(&Message::new(100 + request, NAME_SERVER_ENCLAVE, 7, Body::Notify { owner_process: 4_000_000 + request, segment }), &[]);
    }
    // A revoke of a permit nobody here holds is acknowledged.
    up.send(&Message::new(4, NAME_SERVER_ENCLAVE, 7, Body::Revoke { process: 1, access }), &[]);
    let answer = up.receive().expect("an acknowledgement");
    assert_eq!((answer.header.request, answer.body), (4, Body::Revoked { process: 1, access }), "{}", b.log());
    // Serving a segment B never made fails; so does one from someone other than the name server.
    let serve = Body::Serve { requester: NAME_SERVER_ENCLAVE, owner_process: 1, segment, vaddr: 0x10000, size: 4096 };
    up.send(&Message::new(5, NAME_SERVER_ENCLAVE, 7, serve.clone()), &[]);
    let answer = up.receive().expect("an answer to the serve");
    assert_eq!(answer.header.request, 5);
    assert!(matches!(answer.body, Body::Failed { .. }), "{answer:?}");
    up.send(&Message::new(6, 9, 7, serve.clone()), &[]);
    // A burst of serves: each is answered (a bounded number are served at once).
    for request in 0..200u64 {
        up.send(&Message::new(10_000 + request, NAME_SERVER_ENCLAVE, 7, serve.clone()), &[]);
    }
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 200 {
        let answer = up.receive().unwrap_or_else(|| panic!("{} of 200 serves answered: {}", answered.len(), b.log()));
        assert!(matches!(answer.body, Body::Failed { .. }), "{answer:?}");
        answered.insert(answer.header.request);
    }
    // A request with a trailing byte is answered Malformed.
    let mut bad = Message::new(8, NAME_SERVER_ENCLAVE, 7, Body::Lookup { name: Name::new(b"x").unwrap() }).to_bytes().unwrap();
    bad.push(0);
    up.send_bytes(&bad, &[]);
    let answer = up.receive().expect("an answer to the malformed request");
    assert_eq!((answer.header.request, answer.body), (8, Body::Failed { error: xemem::Error::Malformed }), "{}", b.log());
    assert_eq!(b.call(json!({"op": "ls"}))["ok"], true, "{}", b.log());
    // The upstream says B's own id is gone: B rejoins, and answered as a name server answers
    // discovery it asks for a new id; it keeps serving its API.
    up.send(&Message::new(0, 0, 0, Body::EnclaveGone { enclave: 7 }), &[]);
    up.send(&Message::new(0, 0, 0, Body::PongNameServer), &[]);
    let asked = up.receive().expect("B asks for a new id");
    assert!(matches!(asked.body, Body::EnclaveIdRequest { .. }), "{asked:?}\n{}", b.log());
    assert_eq!(b.call(json!({"op": "ls"}))["ok"], true, "{}", b.log());
    // The fake daemon hangs up: B links again and asks for a new id.
    drop(up);
    let again = FakePeer::upstream_of(&listener, 8);
    assert!(b.wait_for_log("the name server gave this daemon enclave id 8", Duration::from_secs(5)).is_some(), "{}", b.log());
    assert_eq!(b.call(json!({"op": "ls"}))["ok"], true, "{}", b.log());
    drop(again);
}

/// Page-word access to a memfd without mapping it.
trait PageWords {
    fn write_all_at_page(&self, page: u64, value: u64);
    fn read_page_word(&self, page: u64, word: u64) -> u64;
}

impl PageWords for File {
    fn write_all_at_page(&self, page: u64, value: u64) {
        use std::os::unix::fs::FileExt;
        self.write_all_at(&value.to_le_bytes(), page * 4096).unwrap();
    }
    fn read_page_word(&self, page: u64, word: u64) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; 8];
        self.read_exact_at(&mut bytes, page * 4096 + word * 8).unwrap();
        u64::from_le_bytes(bytes)
    }
}

/// The full three-hop route: a job in an LWK enclave under the sub-manager B exports a segment
/// (its node -> B -> A's name server); a host process on A attaches it (A's name server ->
/// B -> the enclave's kernel, whose guest-physical frames B names as ranges of the enclave's
/// RAM memfd and passes to A as descriptors). The host process reads the job's pages and
/// writes what the job waits for: the job's own memory, no copy.
#[test]
fn a_host_process_on_the_name_server_attaches_an_lwk_segment_under_a_sub_manager() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-multihop-three-hops", "lwk_named_owner", "host_attacher") else { return };
    let a = Daemon::start(&dir.0.join("a"), None);
    let b = enclave_sub_manager(&dir.0.join("b"), &a);
    let enclave_id = create_lwk_enclave(&b.socket(), "owner", 1, "128M");
    lwk_segment_attached_from(&b, "owner", enclave_id, &a, &job, &attacher, &dir.0);
    remove_enclaves(&b.socket(), &["owner"]);
}

/// Runs `lwk_named_owner` in enclave `enclave` (XEMEM id `enclave_id`) of `owner_at` while
/// `host_attacher` runs against `attacher_at`'s broker: the host process reads the job's 16
/// pages and writes the 42 the job waits for.
fn lwk_segment_attached_from(
    owner_at: &Daemon,
    enclave: &str,
    enclave_id: u32,
    attacher_at: &Daemon,
    job: &Path,
    attacher: &Path,
    cwd: &Path,
) {
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job(owner_at, enclave, job, cwd));
        let daemons = || format!("owner's daemon:\n{}\nattacher's daemon:\n{}", owner_at.log(), attacher_at.log());
        assert_host_attacher_reads_the_job(attacher, &attacher_at.xemem_socket(), enclave_id, daemons);
        let (reply, stdout) = runner.join().unwrap();
        let context = format!("job: {reply} {stdout}\n{}", daemons());
        assert_eq!(reply["status"], 0, "{context}");
        assert!(stdout.contains("the host wrote 42"), "{context}");
    });
}

/// An LWK job two daemon levels below a host process's daemon (enclave under D, D under B,
/// host process on B), and in a sibling subtree (host process on C, a sibling of B): the name
/// server grants B's permit directly, the enclave's frames go up as its RAM memfd.
#[test]
fn host_processes_above_and_beside_attach_an_lwk_segment_deep_in_the_tree() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-multihop-tree-lwk", "lwk_named_owner", "host_attacher") else { return };
    let (_a, b, c, d, enclave_id) = tree_with_an_enclave_under_d(&dir.0, "owner");
    lwk_segment_attached_from(&d, "owner", enclave_id, &b, &job, &attacher, &dir.0);
    lwk_segment_attached_from(&d, "owner", enclave_id, &c, &job, &attacher, &dir.0);
    lwk_segment_attached_from(&d, "owner", enclave_id, &d, &job, &attacher, &dir.0);
    remove_enclaves(&d.socket(), &["owner"]);
}

/// The name server's daemon restarts above a sub-manager with an LWK enclave: the sub-manager
/// rejoins with a new id and tells the enclave its id went too (`EnclaveGone` naming it), so
/// the enclave's kernel rejoins and gets a new id without being recreated, and a host process
/// on the new name server's daemon attaches a segment the enclave's job makes then.
#[test]
fn an_lwk_enclave_under_a_sub_manager_rejoins_after_its_name_server_restarts() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-multihop-lwk-rejoin", "lwk_named_owner", "host_attacher") else { return };
    let a = Daemon::start(&dir.0.join("a"), None);
    let b = enclave_sub_manager(&dir.0.join("b"), &a);
    let before = create_lwk_enclave(&b.socket(), "owner", 1, "128M");
    let b_ids = ids_logged(&b).len();
    drop(a);
    let a = Daemon::start(&dir.0.join("a"), None);
    let b_again = new_id(&b, b_ids, Duration::from_secs(20)).unwrap_or_else(|| panic!("B got no new id:\n{}\nA:\n{}", b.log(), a.log()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let ids = lwk_xemem_ids(&b, "owner");
        if ids.len() > 1 {
            break *ids.last().unwrap();
        }
        assert!(Instant::now() < deadline, "the enclave got no new XEMEM id: {ids:?}\nB:\n{}", b.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(after, b_again);
    eprintln!("enclave id before {before}, after {after} (B now {b_again})");
    lwk_segment_attached_from(&b, "owner", after, &a, &job, &attacher, &dir.0);
    remove_enclaves(&b.socket(), &["owner"]);
}

/// An LWK job deep in the tree removes its segment while host processes on every other
/// daemon hold attachments of it: on B (whose permit the name server granted directly, the
/// owner being below B), on C (bridged by the name server's daemon), on A and on D. The
/// enclave's RAM is not truncated by a remove, so each must be revoked before the remove is
/// done: every one gets SIGBUS.
#[test]
fn an_lwk_owners_remove_deep_in_the_tree_revokes_host_attachers_on_every_daemon() {
    let Some((dir, job, writer)) = job_test_programs("clowderd-multihop-lwk-remove", "lwk_named_owner", "host_attacher") else { return };
    let holder = host_program(&dir.0, "host_held_attacher");
    let (a, b, c, d, _) = tree_with_an_enclave_under_d(&dir.0, "owner");
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job(&d, "owner", &job, &dir.0));
        let mut held = Vec::new();
        for (at, name) in [(&b, "B"), (&c, "C"), (&a, "A"), (&d, "D")] {
            let mut process = HostProcess::spawn(&holder, &at.xemem_socket(), &["lwk-owner-seg", "1000"]);
            let attached = process.wait_for("attached:", Duration::from_secs(20));
            assert!(
                attached.as_deref().is_some_and(|l| l.starts_with("page 0 starts with 1000")),
                "{name}: {:?}\n{}",
                process.seen,
                at.log()
            );
            held.push((name, process));
        }
        // The job waits for 42, then removes its segment.
        let wrote = Command::new(&writer).env("CLOWDER_XEMEM_SOCKET", b.xemem_socket()).output().unwrap();
        assert!(wrote.status.success(), "{}", String::from_utf8_lossy(&wrote.stdout));
        let (reply, stdout) = runner.join().unwrap();
        assert!(stdout.contains("remove: 0"), "{reply} {stdout}");
        for (name, process) in held {
            let (status, output) = process.finish(Duration::from_secs(15));
            assert!(
                output.contains("SIGBUS after the owner went: 1"),
                "{name}: {status:?} {output}\nA:\n{}\nB:\n{}\nD:\n{}",
                a.log(),
                b.log(),
                d.log()
            );
        }
    });
    remove_enclaves(&d.socket(), &["owner"]);
}

/// XEMEM's signals between an LWK job deep in the tree (an enclave under D, D under B under A)
/// and host owners elsewhere: `notify_peer` as the job and as host processes on C (a sibling
/// subtree) and on B (the daemon above D), each pair both ways.
#[test]
fn signals_between_an_lwk_job_under_a_sub_manager_and_host_owners_elsewhere() {
    let Some(dir) = job_test_dir("clowderd-multihop-lwk-signals") else { return };
    let job = lwk_job(&dir.0, "notify_peer");
    let host = dir.0.join("notify_peer_host");
    support::build_host_program("notify_peer.c", &host);
    let (_a, b, c, d, _) = tree_with_an_enclave_under_d(&dir.0, "lwk");
    for (host_at, tag) in [(&c, "c"), (&b, "b")] {
        for job_waits in [true, false] {
            let (job_own, host_own) = (format!("lwk-{tag}-{job_waits}-job"), format!("lwk-{tag}-{job_waits}-host"));
            let (job_role, host_role) = if job_waits { ("wait", "signal") } else { ("signal", "wait") };
            std::thread::scope(|scope| {
                let runner = scope.spawn(|| run_job_with(&d, "lwk", &job, &[&job_own, &host_own, job_role], &dir.0));
                let party = HostProcess::spawn(&host, &host_at.xemem_socket(), &[&host_own, &job_own, host_role]);
                let (status, output) = party.finish(Duration::from_secs(60));
                let (reply, stdout) = runner.join().unwrap();
                let context = format!(
                    "{tag}, job waits {job_waits}\nhost ({status:?}):\n{output}\njob: {reply}\n{stdout}\nB:\n{}\nD:\n{}",
                    b.log(),
                    d.log()
                );
                assert!(output.contains("woke 1") && output.contains(&format!("signalled {job_own}")), "{context}");
                assert!(stdout.contains("woke 1") && stdout.contains(&format!("signalled {host_own}")), "{context}");
                assert_eq!(status, Some(0), "{context}");
                assert_eq!(reply["status"], 0, "{context}");
            });
        }
    }
    remove_enclaves(&d.socket(), &["lwk"]);
}

/// Runs `job ARGS` in enclave `name` of `d` on a thread, its stdout gathered in `out` as it
/// comes; the thread returns the final reply.
fn spawn_job<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    d: &'s Daemon,
    name: &'s str,
    job: &'s Path,
    args: Vec<String>,
    cwd: &'s Path,
    out: &'s std::sync::Mutex<String>,
) -> std::thread::ScopedJoinHandle<'s, Value> {
    scope.spawn(move || {
        let mut argv = vec![job.file_name().unwrap().to_str().unwrap()];
        argv.extend(args.iter().map(String::as_str));
        support::run_job(&d.socket(), name, job, &argv, cwd, out)
    })
}

/// A sub-manager dies while LWK jobs elsewhere hold its host owner's memory: B's
/// `host_keeper` owner, attached by a job in an enclave of A and by one in an enclave of C
/// (B's sibling; the permit is bridged by A and by C). When B is killed, both jobs get SIGBUS
/// inside their attachments (the memory is taken out of their machines) and detach.
#[test]
fn a_dead_sub_managers_segments_are_revoked_in_lwk_jobs_elsewhere() {
    let Some(dir) = job_test_dir("clowderd-multihop-dead-lwk") else { return };
    let job = lwk_job(&dir.0, "lwk_revoked_attacher");
    let keeper = support_program(&dir.0, "host_keeper");
    let a = Daemon::start_with_machines(&dir.0.join("a"), None);
    let (mut b, _) = sub_manager(&dir.0.join("b"), &a);
    let c = enclave_sub_manager(&dir.0.join("c"), &a);
    for at in [&a, &c] {
        create_lwk_enclave(&at.socket(), "attacher", 1, "128M");
    }
    let owner = HostProcess::owner(&keeper, &b.xemem_socket(), &["dead-lwk", "3000"]);
    let outputs = [std::sync::Mutex::new(String::new()), std::sync::Mutex::new(String::new())];
    let args = || vec!["handler".to_string(), "1".to_string(), "dead-lwk".to_string(), "3000".to_string()];
    let replies = std::thread::scope(|scope| {
        let on_a = spawn_job(scope, &a, "attacher", &job, args(), &dir.0, &outputs[0]);
        let on_c = spawn_job(scope, &c, "attacher", &job, args(), &dir.0, &outputs[1]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !outputs.iter().all(|out| out.lock().unwrap().contains("wrote 44")) {
            assert!(
                Instant::now() < deadline,
                "the jobs never attached: {:?} {:?}\nA:\n{}\nC:\n{}",
                outputs[0].lock().unwrap(),
                outputs[1].lock().unwrap(),
                a.log(),
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        b.child.kill().unwrap();
        let _ = b.child.wait();
        // A job that never sees SIGBUS spins: its enclave is removed after a minute.
        let watchdog = scope.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline && !outputs.iter().all(|out| out.lock().unwrap().contains("release:")) {
                std::thread::sleep(Duration::from_millis(100));
            }
            for at in [&a, &c] {
                if !outputs.iter().all(|out| out.lock().unwrap().contains("release:")) {
                    let _ = at.call(json!({"op": "rm", "name": "attacher"}));
                }
            }
        });
        let replies = (on_a.join().unwrap(), on_c.join().unwrap());
        watchdog.join().unwrap();
        replies
    });
    for (reply, (out, name)) in [replies.0, replies.1].iter().zip(outputs.iter().zip(["A", "C"])) {
        let out = out.lock().unwrap();
        let context = format!("{name}: {reply}\n{out}\nA:\n{}\nC:\n{}", a.log(), c.log());
        assert_eq!(reply["status"], 0, "{context}");
        assert!(out.contains("16 of 16 pages hold the owner's pattern"), "{context}");
        assert!(out.contains("main thread: SIGBUS inside the attachment: 1"), "{context}");
        assert!(out.contains("detach: 0"), "{context}");
    }
    let _ = owner.finish(Duration::from_millis(10));
    for at in [&a, &c] {
        remove_enclaves(&at.socket(), &["attacher"]);
    }
}

/// The XEMEM ids the LWK in enclave `name` of daemon `d` has logged, oldest first.
fn lwk_xemem_ids(d: &Daemon, name: &str) -> Vec<u32> {
    support::lwk_xemem_ids(&d.socket(), name)
}

/// Runs `job` in enclave `name` of daemon `d`; returns the final reply and the job's stdout.
fn run_job(d: &Daemon, name: &str, job: &Path, cwd: &Path) -> (Value, String) {
    run_job_with(d, name, job, &[], cwd)
}

/// [`run_job`] with arguments after argv[0].
fn run_job_with(d: &Daemon, name: &str, job: &Path, args: &[&str], cwd: &Path) -> (Value, String) {
    let mut argv = vec![job.file_name().unwrap().to_str().unwrap()];
    argv.extend_from_slice(args);
    run_job_to_end(&d.socket(), name, job, &argv, cwd)
}

/// The other way down: a host process on the name server's daemon exports a segment, and a
/// job in an LWK enclave under the sub-manager attaches it. B takes the permit upstream as a
/// proxy, A passes the owner's memfds to B, and B adds them to the enclave's machine as
/// guest-physical regions: the owner's pages in the job, no copy.
#[test]
fn an_lwk_job_under_a_sub_manager_attaches_a_host_segment_on_the_name_servers_daemon() {
    let Some((dir, job, owner)) = job_test_programs("clowderd-multihop-down", "lwk_host_attacher", "host_named_owner") else { return };
    let a = Daemon::start(&dir.0.join("a"), None);
    let b = enclave_sub_manager(&dir.0.join("b"), &a);
    create_lwk_enclave(&b.socket(), "attacher", 1, "128M");
    let host = HostProcess::owner(&owner, &a.xemem_socket(), &[]);
    let (reply, stdout) = run_job(&b, "attacher", &job, &dir.0);
    let (host_status, host_rest) = host.finish(Duration::from_secs(60));
    let context = format!("job: {reply}\n{stdout}\nowner: {host_rest}\nA:\n{}\nB:\n{}", a.log(), b.log());
    assert_eq!(reply["status"], 0, "{context}");
    assert!(stdout.contains("found a segment of enclave 1"), "{context}");
    assert_eq!(host_status, Some(0), "{context}");
    assert!(host_rest.contains("the LWK wrote 43"), "{context}");
    assert!(host_rest.contains("remove: 0"), "{context}");
    assert!(stdout.contains("16 of 16 pages hold what the host wrote") && stdout.contains("second attach: 16 of 16 pages"), "{context}");
    // The owner's memory became a region of the enclave's machine on B; the second attach of
    // the same range resumed the parked attachment; the attach of all but the first page and
    // the last whole attach each replaced the region; the last went with the permit.
    let lines = log_lines(&b.socket(), "attacher");
    let (added, removed) = regions_added_and_removed(&lines);
    assert!(added == 3 && removed == 3, "regions added {added}, removed {removed}: {lines:?}");
    remove_enclaves(&b.socket(), &["attacher"]);
}

/// Revocation across the link: a host owner removes its segment while a job in an enclave
/// touches its attachment, owner and enclave under the daemons `owner_on_b` and `enclave_on_b`
/// say. Whoever bridged the job's permit revokes the job's attachment, and the owner's remove
/// is answered (after which its library truncates the memory) only when the enclave has let
/// go. The job's SIGBUS handler sees the fault, detach gives 0 and release ENOENT, the owner
/// keeps its data, and every region added to the enclave's machine goes again.
fn revoke_across(tag: &str, owner_on_b: bool, enclave_on_b: bool) {
    let Some((dir, job, owner)) = job_test_programs(tag, "lwk_revoked_attacher", "host_revoking_owner") else { return };
    let a = Daemon::start_with_machines(&dir.0.join("a"), None);
    let b = enclave_sub_manager(&dir.0.join("b"), &a);
    let (owner_at, enclave_at) = (if owner_on_b { &b } else { &a }, if enclave_on_b { &b } else { &a });
    create_lwk_enclave(&enclave_at.socket(), "attacher", 1, "128M");
    let host = HostProcess::owner(&owner, &owner_at.xemem_socket(), &["remove"]);
    // A job that never sees SIGBUS spins for ever: after a minute the enclave is removed, which
    // ends it (and the test fails below).
    let b_socket = enclave_at.socket();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        if let Ok(mut client) = Client::connect_to(&b_socket) {
            let _ = client.call(&json!({"op": "rm", "name": "attacher"}));
        }
    });
    let (reply, job_stdout) = run_job_with(enclave_at, "attacher", &job, &["handler"], &dir.0);
    let (owner_status, owner_stdout) = host.finish(Duration::from_secs(60));
    let enclave_log = log_lines(&enclave_at.socket(), "attacher");
    let run = RevokeRun { job_status: reply["status"].clone(), job_stdout, owner_status, owner_stdout, enclave_log };
    run.assert_the_handler_saw_the_remove(&format!("A:\n{}\nB:\n{}", a.log(), b.log()));
    remove_enclaves(&enclave_at.socket(), &["attacher"]);
}

/// The owner on the name server's daemon, the job under the sub-manager, which holds the
/// permit upstream as a proxy: the sub-manager acknowledges the revoke only after the job's
/// enclave has.
#[test]
fn a_host_owners_remove_gives_an_lwk_job_under_a_sub_manager_sigbus() {
    revoke_across("revoke-down", false, true);
}

/// Owner and job both under the sub-manager: the remove goes to the name server, and the
/// sub-manager revokes its enclave's attachment before the owner's remove is answered.
#[test]
fn a_sub_manager_owners_remove_gives_an_lwk_job_under_it_sigbus() {
    revoke_across("revoke-local", true, true);
}

/// The owner under the sub-manager, the job under the name server's daemon: the name server's
/// daemon revokes the job's attachment before it removes the segment and answers.
#[test]
fn a_sub_manager_owners_remove_gives_an_lwk_job_on_the_name_servers_daemon_sigbus() {
    revoke_across("revoke-up", true, false);
}
