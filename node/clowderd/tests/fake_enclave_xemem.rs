//! XEMEM over a fake enclave's channel (`fake_enclave/`): ids from the daemon's name server,
//! malformed messages, and the fake enclave's segment attached for host processes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clowder_test_support::TempDir;
use clowderd::enclave::Liveness;
use serde_json::json;

mod fake_enclave;
mod support;

use fake_enclave::{daemon_with_enclave, fake_hardware, start_daemon, TestDaemon, SEGMENT_PAGES};

#[test]
fn enclaves_get_xemem_ids_from_the_daemons_name_server() {
    let daemon = start_daemon("xemem", Liveness::default());
    daemon.create("first");
    daemon.create("second");
    let work = TempDir::new("clowderd-xemem-work");
    let mut ids = Vec::new();
    for enclave in ["first", "second"] {
        let (reply, stdout, _) = daemon.run(enclave, &["prog", "xemem-id"], &work.0, &[]);
        assert_eq!(reply["status"], 0, "{reply}");
        let id: u32 = stdout.trim().strip_prefix("xemem enclave id ").unwrap_or_else(|| panic!("{enclave}: {stdout}")).parse().unwrap();
        ids.push(id);
    }
    // Enclave 1 is the name server itself; every enclave gets an id of its own.
    assert!(ids.iter().all(|&id| id >= 2), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    // A malformed XEMEM message is answered with an error, and the link keeps working.
    let (reply, stdout, _) = daemon.run("first", &["prog", "xemem-malformed"], &work.0, &[]);
    assert_eq!(reply["status"], 0, "{reply}");
    assert_eq!(stdout, "malformed: answered Failed(Malformed)\n");
    let (_, stdout, _) = daemon.run("first", &["prog", "xemem-id"], &work.0, &[]);
    assert_eq!(stdout, format!("xemem enclave id {}\n", ids[0]));
}

/// A daemon for test `label` with the one enclave `enclave`, a working directory for its jobs,
/// and the daemon's XEMEM links, through which the tests attach as a host process would.
fn xemem_owner_daemon(label: &str, enclave: &str) -> (TestDaemon, TempDir, Arc<clowderd::xemem::XememLinks>) {
    let (daemon, work) = daemon_with_enclave(label, Liveness::default(), enclave);
    let links = daemon.daemon.xemem_links().clone();
    (daemon, work, links)
}

/// Root's credentials, which the tests' host-side attaches carry.
fn root() -> xemem::Credentials {
    xemem::Credentials { uid: 0, groups: vec![0] }
}

/// The id of the segment named `name`, once its owner has made it (5 s at most).
fn wait_for_segment(links: &clowderd::xemem::XememLinks, name: &str) -> xemem::ids::SegmentId {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match links.lookup(name) {
            Ok(segment) => return segment,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{name}: {e:?}"),
        }
    }
}

/// Maps every file range of an attach of the fake owner's segment and checks that page `n`
/// reads `1000 + n`, as the fake job wrote into its frames.
fn assert_reads_the_fake_segment(runs: &[clowderd::xemem::FileRun]) {
    let expected: Vec<u64> = (1000..1000 + SEGMENT_PAGES).collect();
    assert_eq!(support::MappedRuns::new(runs).first_words(), expected, "each page reads the enclave's frame");
}

/// The daemon keeps an owner enclave's frames for an attach while the owner kernel's published
/// count of page-table changes stays put: attaching the same range again maps the same frames
/// without asking the owner's kernel (slow to run on this machine); once the count moves, the
/// owner is asked again.
#[test]
fn an_owner_enclave_is_asked_again_only_after_its_mappings_changed() {
    let (daemon, work, links) = xemem_owner_daemon("xemem-owner-runs", "owner-runs-kept");
    std::thread::scope(|scope| {
        let owner = scope.spawn(|| daemon.run("owner-runs-kept", &["prog", "xemem-owner", "honest", "2"], &work.0, &[]));
        let segment = wait_for_segment(&links, "fake-seg-honest");
        let hardware = fake_hardware("owner-runs-kept");
        let resolves = || hardware.xemem_resolves.load(Ordering::SeqCst);
        let attach_and_check = || {
            let (access, runs) = links.attach_enclave_segment(4242, root(), segment, 0, SEGMENT_PAGES * 4096).expect("attach");
            assert_reads_the_fake_segment(&runs);
            access
        };
        for attach in 1..=3 {
            let access = attach_and_check();
            assert_eq!(resolves(), 1, "attach {attach}: only the first asks the owner; nothing changed since");
            links.release(4242, access).expect("release");
        }
        hardware.count_mapping_change();
        let access = attach_and_check();
        assert_eq!(resolves(), 2, "a mapping changed: the owner is asked again");
        // Its second resolve ends the owner's job, which removes the segment and the permits
        // on it: the release finds the permit, or finds it gone (ENOENT, as XPMEM).
        let released = links.release(4242, access);
        assert!(matches!(released, Ok(()) | Err(xemem::Error::NotFound)), "{released:?}");
        let (reply, stdout, _) = owner.join().unwrap();
        assert_eq!(reply["status"], 0, "{reply}");
        assert_eq!(stdout, "made and served\n");
    });
}

/// An enclave's segment attached for a host process: the owner answers with guest-physical
/// frame runs, the daemon checks each against the enclave's RAM and hands out ranges of the
/// RAM memfd, which map the enclave's very pages (no copy). Runs outside RAM or over the
/// channel fail the attach with EINVAL.
#[test]
fn a_host_process_maps_an_enclave_segment_through_the_ram_memfd() {
    let (daemon, work, links) = xemem_owner_daemon("xemem-attach", "owner");
    let lookup = |name: &str| wait_for_segment(&links, name);
    std::thread::scope(|scope| {
        let owner = scope.spawn(|| daemon.run("owner", &["prog", "xemem-owner", "honest"], &work.0, &[]));
        let segment = lookup("fake-seg-honest");
        assert!(segment.enclave() >= 2, "an enclave's segment names its enclave: {segment:?}");
        // `clowder xemem ls` lists the enclave's segment beside the host's.
        let broker_socket = work.0.join("xemem.sock");
        assert!(daemon.daemon.host_xemem(clowderd::xemem::service::start(&broker_socket).unwrap()).is_ok());
        let listing = daemon.call(json!({"op": "xemem_ls"}));
        let listed = listing["segments"].as_array().unwrap_or_else(|| panic!("{listing}"));
        assert!(
            listed.iter().any(|s| s["name"] == "fake-seg-honest" && s["owner_enclave"] == segment.enclave() && s["size"] == 16 * 4096),
            "{listing}"
        );
        let (access, runs) = links.attach_enclave_segment(4242, root(), segment, 0, 16 * 4096).expect("attach");
        assert_eq!(runs.len(), 2, "one file range per frame run: {runs:?}");
        assert_reads_the_fake_segment(&runs);
        // The owner's job ends once it has served, and its end removes the segment and the
        // permits on it: the release finds the permit, or finds it gone (ENOENT, as XPMEM).
        let released = links.release(4242, access);
        assert!(matches!(released, Ok(()) | Err(xemem::Error::NotFound)), "{released:?}");
        let (reply, stdout, _) = owner.join().unwrap();
        assert_eq!(reply["status"], 0, "{reply}");
        assert_eq!(stdout, "made and served\n");
    });
    for lie in ["outside", "channel"] {
        std::thread::scope(|scope| {
            let owner = scope.spawn(|| daemon.run("owner", &["prog", "xemem-owner", lie], &work.0, &[]));
            let segment = lookup(&format!("fake-seg-{lie}"));
            let refused = links.attach_enclave_segment(4242, root(), segment, 0, 16 * 4096);
            assert_eq!(refused.err(), Some(xemem::Error::Invalid), "{lie}: frames that are not the enclave's RAM");
            owner.join().unwrap();
        });
    }
    // The daemon survived all of it.
    let (reply, stdout, _) = daemon.run("owner", &["prog", "echo", "still", "here"], &work.0, &[]);
    assert_eq!(reply["status"], 0);
    assert_eq!(stdout, "still here\n");
}
