//! XEMEM between the daemon and a real persistent LWK enclave: clowderd (in this process, with
//! the real `clowder-vmm` launcher) boots the LWK, whose XEMEM node finds the daemon's name
//! server over the enclave channel and gets an enclave id of its own; a second enclave gets
//! another. A job in an enclave exports memory with `xemem_make` (the LWK's /dev/xpmem, through
//! its node to the daemon's name server), and the daemon attaches it for a host process: the
//! enclave's own pages, through its RAM memfd, written by the host and seen by the job.
//! The same job's segment is then attached by an ordinary host process through libxpmem and
//! the daemon's broker. Needs /dev/kvm, musl-gcc, the LWK image (cd kernels && cargo build --release -p lwk) and
//! clowder-vmm (cargo build --release -p clowder-vmm); skipped, with the reason, otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

mod support;
use support::processes::HostProcess;
use support::{
    assert_host_attacher_reads_the_job, assert_regions_come_and_go, call, create_lwk_enclave, host_program, job_test_dir,
    job_test_programs, log_lines, lwk_job, missing_requirement, regions_added_and_removed, remove_enclaves, run_job, run_job_to_end,
    skipped, start_daemon_with_broker, BrokeredDaemon, MappedRuns, RevokeRun, TempDir,
};

#[test]
fn lwk_enclaves_get_xemem_ids_from_the_daemon() {
    if skipped(missing_requirement()) {
        return;
    }
    let dir = TempDir::new("clowderd-xemem-lwk");
    let BrokeredDaemon { socket, .. } = start_daemon_with_broker(&dir.0);
    let ids = ["a", "b"].map(|name| create_lwk_enclave(&socket, name, 1, "128M"));
    assert!(ids.iter().all(|&id| id >= 2), "enclave 1 is the daemon's name server: {ids:?}");
    assert_ne!(ids[0], ids[1]);
    remove_enclaves(&socket, &["a", "b"]);
}

#[test]
fn a_host_process_writes_into_an_lwk_jobs_segment() {
    let Some(dir) = job_test_dir("clowderd-xemem-owner") else { return };
    let job = lwk_job(&dir.0, "lwk_named_owner");
    let BrokeredDaemon { socket, links, .. } = start_daemon_with_broker(&dir.0);
    let enclave_id = create_lwk_enclave(&socket, "owner", 1, "128M");

    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job_to_end(&socket, "owner", &job, &["lwk_named_owner"], &dir.0));
        let deadline = Instant::now() + Duration::from_secs(20);
        let segment = loop {
            match links.lookup("lwk-owner-seg") {
                Ok(segment) => break segment,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => panic!("the job's segment never appeared: {e:?}"),
            }
        };
        assert_eq!(segment.enclave(), enclave_id, "the segment names its enclave");
        let root = xemem::Credentials { uid: 0, groups: vec![0] };
        let (access, runs) = links.attach_enclave_segment(4242, root, segment, 0, 16 * 4096).expect("attach the LWK job's segment");
        let memory = MappedRuns::new(&runs);
        assert_eq!(memory.first_words(), (1000..1016).collect::<Vec<u64>>(), "each page holds what the job wrote");
        // The host writes into the job's memory: the job, spinning on it, sees the value.
        memory.write_first_page(1, 42);
        links.release(4242, access).unwrap();
        let (reply, stdout) = runner.join().unwrap();
        assert_eq!(reply["status"], 0, "{reply} {stdout}");
        assert!(stdout.contains(&format!("made a segment of enclave {enclave_id}")), "{stdout}");
        assert!(stdout.contains("the host wrote 42"), "{stdout}");
        assert!(stdout.contains("remove: 0"), "{stdout}");
    });
    // After the job's remove the name is gone.
    assert_eq!(links.lookup("lwk-owner-seg"), Err(xemem::Error::NotFound));
    // A job that ends without removing its segment: the kernel removes it for the job.
    let (reply, _) = run_job_to_end(&socket, "owner", &job, &["lwk_named_owner", "keep"], &dir.0);
    assert_eq!(reply["status"], 0, "{reply}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while links.lookup("lwk-owner-seg").is_ok() {
        assert!(Instant::now() < deadline, "the ended job's segment is still named");
        std::thread::sleep(Duration::from_millis(50));
    }
    remove_enclaves(&socket, &["owner"]);
}

/// A host process attaches the LWK job's segment with the XPMEM API: libxpmem, the daemon's
/// broker, the daemon's name-server node, the owner enclave's frame runs, the RAM memfd.
#[test]
fn a_libxpmem_process_attaches_an_lwk_jobs_segment_through_the_broker() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-xemem-libxpmem", "lwk_named_owner", "host_attacher") else { return };
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    let enclave_id = create_lwk_enclave(&socket, "owner", 1, "128M");
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job_to_end(&socket, "owner", &job, &["lwk_named_owner"], &dir.0));
        assert_host_attacher_reads_the_job(&attacher, &xemem_socket, enclave_id, String::new);
        let (reply, stdout) = runner.join().unwrap();
        assert_eq!(reply["status"], 0, "{reply} {stdout}");
        assert!(stdout.contains("the host wrote 42"), "{stdout}");
    });
    remove_enclaves(&socket, &["owner"]);
}

/// clowderd reuses an owner enclave's answer for a repeated attach while the owner kernel's
/// count of page-table changes stands still; here the real kernel's count must move when the
/// job maps memory over a hole in its segment, or a host process's next attach would map the
/// hole (SIGBUS) instead of the job's new memory.
#[test]
fn a_host_process_attaching_again_sees_memory_an_lwk_job_mapped_since() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-xemem-remap", "lwk_remapping_owner", "host_remap_attacher") else {
        return;
    };
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    create_lwk_enclave(&socket, "owner", 1, "128M");
    let job_stdout = Mutex::new(String::new());
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job(&socket, "owner", &job, &["lwk_remapping_owner"], &dir.0, &job_stdout));
        let host = Command::new(&attacher).env("CLOWDER_XEMEM_SOCKET", &xemem_socket).output().unwrap();
        let host_out = String::from_utf8_lossy(&host.stdout).into_owned();
        let reply = runner.join().unwrap();
        let job_out = job_stdout.lock().unwrap().clone();
        for attach in 1..=3 {
            assert!(host_out.contains(&format!("attach {attach}: the mailbox reads 0")), "{host_out}");
        }
        assert!(host_out.contains("the job mapped its data pages"), "{host_out}\njob: {job_out}");
        assert!(host_out.contains("attached again: 16 of 16 data pages hold the new data"), "{host_out} {:?}", host.status);
        assert!(host.status.success(), "host_remap_attacher: {:?}\n{host_out}", host.status);
        assert_eq!(reply["status"], 0, "{reply} {job_out}");
    });
    remove_enclaves(&socket, &["owner"]);
}

/// The same with the attacher an LWK job in another enclave: the daemon keeps an attachment's
/// regions after the job detaches and hands them out again for the same range (three attaches
/// of the segment while its data pages are a hole add its regions once), but not after the
/// owner's memory changed: the attach after the owner job mapped its data pages must show them
/// (the kept regions' hole would raise SIGBUS).
#[test]
fn an_lwk_job_attaching_again_sees_memory_another_lwk_job_mapped_since() {
    let Some(dir) = job_test_dir("clowderd-xemem-remap-lwk") else { return };
    let owner = lwk_job(&dir.0, "lwk_remapping_owner");
    let attacher = lwk_job(&dir.0, "host_remap_attacher");
    let BrokeredDaemon { socket, links, .. } = start_daemon_with_broker(&dir.0);
    for name in ["owner", "attacher"] {
        create_lwk_enclave(&socket, name, 1, "128M");
    }
    let (owner_stdout, attacher_stdout) = (Mutex::new(String::new()), Mutex::new(String::new()));
    std::thread::scope(|scope| {
        let owner_run = scope.spawn(|| run_job(&socket, "owner", &owner, &["lwk_remapping_owner"], &dir.0, &owner_stdout));
        let attacher_reply = run_job(&socket, "attacher", &attacher, &["host_remap_attacher"], &dir.0, &attacher_stdout);
        let owner_reply = owner_run.join().unwrap();
        let (owner_out, attacher_out) = (owner_stdout.lock().unwrap().clone(), attacher_stdout.lock().unwrap().clone());
        for attach in 1..=3 {
            assert!(attacher_out.contains(&format!("attach {attach}: the mailbox reads 0")), "{attacher_out}");
        }
        assert!(
            attacher_out.contains("the job mapped its data pages"),
            "{attacher_out}
owner: {owner_out}"
        );
        assert!(
            attacher_out.contains("attached again: 16 of 16 data pages hold the new data"),
            "{attacher_out}
{attacher_reply}"
        );
        assert_eq!(attacher_reply["status"], 0, "{attacher_reply} {attacher_out}");
        assert_eq!(owner_reply["status"], 0, "{owner_reply} {owner_out}");
    });
    // Regions added: the first permit's first attach (kept for the next two), the second
    // permit's, and the first permit's after the owner's change; all gone with the permits.
    let lines = log_lines(&socket, "attacher");
    let (added, removed) = regions_added_and_removed(&lines);
    assert!(added == removed && added < 5, "regions added {added}, removed {removed} for five attaches: {lines:?}");
    // The attacher's kernel parked the first attachment and took it up again twice, the
    // owner's count of page-table changes (read-only in its machine) standing still; after the
    // owner mapped its data pages the count had moved, and the kernel asked the daemon: three
    // attaches served for five (the second permit's one of them).
    let words = lines.iter().filter(|l| l.contains("count of page-table changes, read-only")).count();
    assert!(words >= 1, "no read-only region for the owner's count: {lines:?}");
    assert_eq!(links.bridged_attaches(), 3, "{lines:?}");
    remove_enclaves(&socket, &["owner", "attacher"]);
}

/// The other direction: an LWK job attaches a host process's memory. The host program exports
/// a named segment with libxpmem; the job looks it up, gets and attaches it through the LWK's
/// /dev/xpmem; the daemon serves the enclave's requests from the broker and adds the owner's
/// memfd runs to the enclave as guest-physical regions (the VMM's add_region), which the LWK
/// maps. The job sees the owner's pattern and writes a reply the host program sees: the same
/// pages, no copy. Detach keeps the region while the permit is held, and the second attach of
/// the same range takes it again; it goes with the permit.
#[test]
fn an_lwk_job_attaches_a_host_processs_segment() {
    lwk_job_attaches_a_host_segment_twice("small", 16);
}

/// The same with a GiB of the host's memory: the region the daemon adds is GiB-aligned, so the
/// LWK links each attachment to one shared directory of 2 MiB leaves and unlinks it at detach
/// (`SHARED_DIRECTORY` in kernels/lwk/src/arch/paging.rs); every page holds the owner's
/// pattern through both attachments, and the detached view faults.
#[test]
fn an_lwk_job_attaches_a_gigabyte_host_segment_twice() {
    lwk_job_attaches_a_host_segment_twice("gigabyte", 1 << 18);
}

/// And half a GiB, the only mapping in its GiB of the job's address space: a shared directory
/// holding just its 256 blocks, unlinked at detach as a whole GiB is.
#[test]
fn an_lwk_job_attaches_half_a_gigabyte_host_segment_twice() {
    lwk_job_attaches_a_host_segment_twice("half-gigabyte", 1 << 17);
}

/// `an_lwk_job_attaches_a_host_processs_segment` with a segment of `pages` 4 KiB pages.
fn lwk_job_attaches_a_host_segment_twice(tag: &str, pages: u64) {
    let Some((dir, job, owner)) = job_test_programs(&format!("clowderd-xemem-host-owner-{tag}"), "lwk_host_attacher", "host_named_owner")
    else {
        return;
    };
    let BrokeredDaemon { socket, xemem_socket, links } = start_daemon_with_broker(&dir.0);
    create_lwk_enclave(&socket, "attacher", 1, "128M");
    let host = HostProcess::owner(&owner, &xemem_socket, &[&pages.to_string()]);
    let (reply, stdout) = run_job_to_end(&socket, "attacher", &job, &["lwk_host_attacher", &pages.to_string()], &dir.0);
    let (host_status, host_rest) = host.finish(Duration::from_secs(60));
    let lines = log_lines(&socket, "attacher");
    assert_eq!(reply["status"], 0, "{reply}\n{stdout}\n{lines:?}");
    assert!(stdout.contains("found a segment of enclave 1"), "{stdout}");
    assert!(stdout.contains("misaligned attach refused: 1, attach beyond the segment refused: 1"), "{stdout}");
    assert!(stdout.contains(&format!("{pages} of {pages} pages hold what the host wrote")), "{stdout}");
    assert!(stdout.contains("the detached view faults: 1 (first page), 1 (last page)"), "{stdout}");
    assert!(stdout.contains("the attach command through standard output: ENOTTY 1, still parked 1"), "{stdout}");
    assert!(stdout.contains(&format!("second attach: {pages} of {pages} pages, at the first one's address: 1")), "{stdout}");
    assert!(stdout.contains("the detach command through standard output: ENOTTY 1, still attached 1"), "{stdout}");
    let tail = pages - 1;
    assert!(stdout.contains(&format!("all but the first page: {tail} of {tail} pages")), "{stdout}");
    assert!(stdout.contains(&format!("last attach: {pages} of {pages} pages")), "{stdout}");
    assert!(stdout.contains("attach after the owner's remove fails: 1"), "{stdout}");
    assert!(!stdout.contains("detach: -1") && stdout.contains("release: ENOENT"), "{stdout}");
    assert_eq!(host_status, Some(0), "host_named_owner: {host_rest}");
    assert!(host_rest.contains("the LWK wrote 43"), "{host_rest}");
    assert!(host_rest.contains("remove: 0"), "{host_rest}");
    // The first attach added the owner's memory as a region; the second resumed the parked
    // attachment, unknown to the host; the attach of another range replaced it, and the last
    // whole attach replaced that: three regions, each gone (the last with the owner's remove).
    let (added, removed) = regions_added_and_removed(&lines);
    assert!(added == 3 && removed == 3, "regions added {added}, removed {removed}: {lines:?}");
    // The host served three attaches: the second and those after the last detach resumed the
    // parked attachment.
    assert_eq!(links.bridged_attaches(), 3, "{stdout}");
    // Nothing of the host segment is left in the enclave's name: the permit went with release.
    assert!(links.list().is_empty(), "{:?}", links.list());
    remove_enclaves(&socket, &["attacher"]);
}

/// A host owner (`host_revoking_owner <owner_mode>`) exports a segment that an LWK job
/// (`lwk_revoked_attacher <job_args>`, in an enclave of `cores` vCPUs) attaches and touches;
/// the owner then removes the segment or exits while the attachment is in use.
fn run_revocation(tag: &str, owner_mode: &str, job_args: &[&str], cores: u32) -> Option<RevokeRun> {
    let (dir, job, owner) = job_test_programs(&format!("clowderd-xemem-revoke-{tag}"), "lwk_revoked_attacher", "host_revoking_owner")?;
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    create_lwk_enclave(&socket, "attacher", cores, "128M");
    let host = HostProcess::owner(&owner, &xemem_socket, &[owner_mode]);
    let mut argv = vec!["lwk_revoked_attacher"];
    argv.extend_from_slice(job_args);
    let (reply, job_stdout) = run_job_to_end(&socket, "attacher", &job, &argv, &dir.0);
    let (owner_status, owner_stdout) = host.finish(Duration::from_secs(60));
    let enclave_log = log_lines(&socket, "attacher");
    remove_enclaves(&socket, &["attacher"]);
    Some(RevokeRun { job_status: reply["status"].clone(), job_stdout, owner_status, owner_stdout, enclave_log })
}

/// The host owner removes its segment while an LWK job touches its attachment: the remove
/// waits for the enclave's acknowledgement of the revoke, the job's SIGBUS handler sees a fault
/// inside the attachment, the job detaches (0) and finds its permit gone (ENOENT), the owner
/// keeps its data, and the regions the attach added are removed.
#[test]
fn a_host_owners_remove_gives_the_lwk_job_sigbus_in_its_handler() {
    if let Some(run) = run_revocation("remove", "remove", &["handler"], 1) {
        run.assert_the_handler_saw_the_remove("");
    }
}

/// The host owner exits while the job touches the attachment, and the job has no handler:
/// it ends killed by SIGBUS.
#[test]
fn a_host_owners_exit_ends_an_lwk_job_without_a_handler_with_sigbus() {
    let Some(run) = run_revocation("exit", "exit", &["default"], 1) else { return };
    let context = run.context();
    assert_eq!(run.job_status, enclave_proto::KILLED_BY_SIGNAL + libc::SIGBUS as u32, "{context}");
    assert!(run.job_stdout.contains("wrote 44; touching until the memory goes"), "{context}");
    assert!(run.owner_stdout.contains("exiting without a remove"), "{context}");
    assert_regions_come_and_go(&run.enclave_log, &context);
}

/// A two-vCPU job with a thread on each CPU touching the attachment: the revoke unmaps it on
/// one CPU and shoots down the other's TLB, so both threads fault.
#[test]
fn a_revoke_reaches_both_cpus_of_a_two_vcpu_job() {
    let Some(run) = run_revocation("smp", "remove", &["handler", "2"], 2) else { return };
    let context = run.context();
    assert_eq!(run.job_status, 0, "{context}");
    assert!(run.job_stdout.contains("main thread: SIGBUS inside the attachment: 1"), "{context}");
    assert!(run.job_stdout.contains("second thread: SIGBUS inside the attachment: 1"), "{context}");
    assert!(run.owner_stdout.contains("remove: 0"), "{context}");
    assert!(!run.enclave_log.iter().any(|line| line.contains("did not confirm the TLB shootdown")), "{context}");
}

/// XPMEM's anonymous segments from connected enclaves get ids from the daemon's name server:
/// jobs in two enclaves make one each at the same time, the segids name their enclaves (no
/// two enclaves both handing out enclave-1 ids), and a host process attaches each by segid
/// alone through libxpmem and writes into the job's memory.
#[test]
fn anonymous_segments_of_two_enclaves_have_global_ids_a_host_process_can_use() {
    let Some((dir, job, attacher)) = job_test_programs("clowderd-xemem-global", "lwk_anonymous_owner", "host_segid_attacher") else {
        return;
    };
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    let ids = ["a", "b"].map(|name| create_lwk_enclave(&socket, name, 1, "128M"));
    let outputs = [Mutex::new(String::new()), Mutex::new(String::new())];
    std::thread::scope(|scope| {
        let runners: Vec<_> = ["a", "b"]
            .iter()
            .zip(&outputs)
            .map(|(name, stdout)| {
                let (socket, job, dir) = (&socket, &job, &dir.0);
                scope.spawn(move || run_job(socket, name, job, &["lwk_anonymous_owner"], dir, stdout))
            })
            .collect();
        let mut segids = Vec::new();
        for stdout in &outputs {
            let deadline = Instant::now() + Duration::from_secs(30);
            let segid = loop {
                let text = stdout.lock().unwrap().clone();
                if let Some(segid) = text.lines().find_map(|line| line.strip_prefix("segid ").and_then(|id| id.trim().parse::<i64>().ok()))
                {
                    break segid;
                }
                assert!(Instant::now() < deadline, "no segid from the job: {text}");
                std::thread::sleep(Duration::from_millis(50));
            };
            segids.push(segid);
        }
        assert_eq!(segids.iter().map(|segid| (segid >> 32) as u32).collect::<Vec<_>>(), ids, "each segid names its enclave: {segids:?}");
        for segid in &segids {
            let host = Command::new(&attacher).arg(segid.to_string()).env("CLOWDER_XEMEM_SOCKET", &xemem_socket).output().unwrap();
            let out = String::from_utf8_lossy(&host.stdout).into_owned();
            assert!(host.status.success(), "host_segid_attacher {segid}: {:?}\n{out}", host.status);
            assert!(
                out.contains("16 of 16 pages hold what the job wrote") && out.contains("detach: 0") && out.contains("release: 0"),
                "{out}"
            );
            // The job removes its segment only now (see lwk_anonymous_owner.c).
            std::fs::write(dir.0.join(format!("released-{segid}")), "").unwrap();
        }
        for (runner, stdout) in runners.into_iter().zip(&outputs) {
            let reply = runner.join().unwrap();
            let text = stdout.lock().unwrap().clone();
            assert_eq!(reply["status"], 0, "{reply} {text}");
            assert!(text.contains("the host wrote 45") && text.contains("remove: 0"), "{text}");
        }
    });
    remove_enclaves(&socket, &["a", "b"]);
}

/// xemem/tests/same_binary.c (every XPMEM call: argument errors, attaches of 1 to 1024 pages
/// both ways, threads, a whole-address-space segment, detach rules, SIGBUS after remove) in a
/// connected enclave, where all of it goes through the daemon's name server, prints exactly
/// what it prints on the host through the daemon's broker, and both die of SIGBUS.
#[test]
fn the_same_binary_in_a_connected_enclave_matches_the_host() {
    let Some(dir) = job_test_dir("clowderd-xemem-same") else { return };
    let job = lwk_job(&dir.0, "same_binary");
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    let enclave_id = create_lwk_enclave(&socket, "same", 1, "256M");
    let host = Command::new(&job)
        .current_dir(&dir.0)
        .env("CLOWDER_XEMEM_SOCKET", &xemem_socket)
        .env("CLOWDER_XEMEM_BACKEND", "broker")
        .output()
        .unwrap();
    let host_out = String::from_utf8_lossy(&host.stdout).into_owned();
    assert_eq!(host.status.code(), None, "the host run dies of a signal: {host_out}");
    let (reply, lwk_out) = run_job_to_end(&socket, "same", &job, &["same_binary"], &dir.0);
    let logs = call(&socket, json!({"op": "logs", "name": "same"}));
    assert_eq!(reply["status"], enclave_proto::KILLED_BY_SIGNAL + libc::SIGBUS as u32, "{reply}\n{lwk_out}\n{logs}");
    assert!(host_out.contains("version 0x26005") && !host_out.contains("FAIL"), "{host_out}");
    assert_eq!(lwk_out, host_out, "{logs}");
    // The job's segments came from the daemon's name server (its segids name the enclave) and
    // went with the job.
    assert!(logs.to_string().contains(&format!("the name server gave this enclave id {enclave_id}")));
    remove_enclaves(&socket, &["same"]);
}

/// Two LWK enclaves under one daemon: boots both, builds the peer owner and the attacher.
struct TwoEnclaves {
    dir: TempDir,
    socket: PathBuf,
    xemem_socket: PathBuf,
    owner_job: PathBuf,
    attacher_job: PathBuf,
}

fn two_enclaves(tag: &str) -> Option<TwoEnclaves> {
    let dir = job_test_dir(&format!("clowderd-xemem-peers-{tag}"))?;
    let owner_job = lwk_job(&dir.0, "lwk_peer_owner");
    let attacher_job = lwk_job(&dir.0, "lwk_revoked_attacher");
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    for name in ["a", "b"] {
        create_lwk_enclave(&socket, name, 1, "128M");
    }
    Some(TwoEnclaves { dir, socket, xemem_socket, owner_job, attacher_job })
}

const PEER_ATTACHER_ARGS: [&str; 5] = ["lwk_revoked_attacher", "handler", "1", "lwk-peer-seg", "6000"];

/// A job in enclave b attaches a segment a job in enclave a made: zero-copy (the daemon adds
/// a's pages, checked against a's RAM, to b's machine as regions of a's RAM memfd), both see
/// each other's writes, and when a's job removes the segment b's job gets SIGBUS in its
/// handler, detaches, finds its permit gone, and every region b got is removed.
#[test]
fn an_lwk_job_attaches_another_enclaves_segment_and_gets_sigbus_when_it_is_removed() {
    let Some(peers) = two_enclaves("remove") else { return };
    let outputs = [Mutex::new(String::new()), Mutex::new(String::new())];
    let (owner_reply, attacher_reply) = std::thread::scope(|scope| {
        let owner = scope.spawn(|| run_job(&peers.socket, "a", &peers.owner_job, &["lwk_peer_owner", "remove"], &peers.dir.0, &outputs[0]));
        let attacher = scope.spawn(|| run_job(&peers.socket, "b", &peers.attacher_job, &PEER_ATTACHER_ARGS, &peers.dir.0, &outputs[1]));
        (owner.join().unwrap(), attacher.join().unwrap())
    });
    let [owner_out, attacher_out] = outputs.map(|output| output.into_inner().unwrap());
    let b_log = log_lines(&peers.socket, "b");
    let context = format!("owner {owner_reply}:\n{owner_out}\nattacher {attacher_reply}:\n{attacher_out}\n{b_log:#?}");
    assert_eq!(owner_reply["status"], 0, "{context}");
    assert_eq!(attacher_reply["status"], 0, "{context}");
    assert!(
        owner_out.contains("the other enclave wrote 44") && owner_out.contains("remove: 0") && owner_out.contains("owner data intact: 1"),
        "{context}"
    );
    assert!(attacher_out.contains("16 of 16 pages hold the owner's pattern"), "{context}");
    assert!(!attacher_out.contains("found a segment of enclave 1\n"), "the segment is enclave a's: {context}");
    assert!(attacher_out.contains("main thread: SIGBUS inside the attachment: 1"), "{context}");
    assert!(attacher_out.contains("detach: 0") && attacher_out.contains("release: -1 (errno 2)"), "{context}");
    assert_regions_come_and_go(&b_log, &context);
    remove_enclaves(&peers.socket, &["a", "b"]);
}

/// Enclave a is removed while b's job and a host process touch their attachments of a's
/// segment: the name server drops a's segments, b's job and the host process get SIGBUS, and
/// the daemon goes on serving (a new enclave gets an XEMEM id; the segment's name is gone).
#[test]
fn removing_an_owner_enclave_gives_its_attachers_in_other_enclaves_sigbus() {
    let Some(peers) = two_enclaves("owner-gone") else { return };
    let host_attacher = host_program(&peers.dir.0, "host_held_attacher");
    let outputs = [Mutex::new(String::new()), Mutex::new(String::new())];
    let (attacher_reply, host) = std::thread::scope(|scope| {
        let _owner = scope.spawn(|| run_job(&peers.socket, "a", &peers.owner_job, &["lwk_peer_owner", "hold"], &peers.dir.0, &outputs[0]));
        let attacher = scope.spawn(|| run_job(&peers.socket, "b", &peers.attacher_job, &PEER_ATTACHER_ARGS, &peers.dir.0, &outputs[1]));
        let mut host = HostProcess::spawn(&host_attacher, &peers.xemem_socket, &["lwk-peer-seg", "6000"]);
        let attached = host.wait_for("attached:", Duration::from_secs(60));
        assert!(attached.as_deref().is_some_and(|l| l.starts_with("page 0 starts with 6000")), "host attacher: {:?}", host.seen);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !outputs[0].lock().unwrap().contains("the other enclave wrote 44") {
            assert!(Instant::now() < deadline, "the attacher never wrote: {}", outputs[1].lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
        remove_enclaves(&peers.socket, &["a"]);
        (attacher.join().unwrap(), host.finish(Duration::from_secs(60)))
    });
    let (host_status, host_out) = host;
    assert!(host_status == Some(0) && host_out.contains("SIGBUS after the owner went: 1"), "host attacher {host_status:?}: {host_out}");
    let attacher_out = outputs[1].lock().unwrap().clone();
    let b_log = log_lines(&peers.socket, "b");
    let context = format!("attacher {attacher_reply}:\n{attacher_out}\n{b_log:#?}");
    assert_eq!(attacher_reply["status"], 0, "{context}");
    assert!(attacher_out.contains("main thread: SIGBUS inside the attachment: 1"), "{context}");
    assert_regions_come_and_go(&b_log, &context);
    // The daemon serves on: a new enclave gets an XEMEM id.
    create_lwk_enclave(&peers.socket, "c", 1, "128M");
    remove_enclaves(&peers.socket, &["b", "c"]);
}

/// Where one side of a cross-enclave conformance case runs.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Place {
    Host,
    /// A job in this enclave.
    Lwk(&'static str),
}

/// Runs `cross ROLE CASE` at `place`; returns (succeeded, output).
fn run_cross_role(place: Place, role: &str, case: &str, binary: &Path, dir: &Path, socket: &Path, xemem_socket: &Path) -> (bool, String) {
    match place {
        Place::Host => {
            let out = Command::new(binary)
                .args([role, case])
                .current_dir(dir)
                .env("CLOWDER_XEMEM_SOCKET", xemem_socket)
                .env("CLOWDER_XEMEM_BACKEND", "broker")
                .output()
                .unwrap();
            (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        }
        Place::Lwk(enclave) => {
            let (reply, text) = run_job_to_end(socket, enclave, binary, &["cross", role, case], dir);
            (reply["status"] == 0, format!("{text}[job: {reply}]"))
        }
    }
}

/// xemem/tests/cross.c: XPMEM's two-party conformance cases (base, two_attach, two_shares,
/// holes_sigbus, remove_sigbus, owner_exit_sigbus, patterns up to 10,000 pages, permissions
/// as "others", id_errors) with the owner on the host and the attacher in an LWK enclave, the
/// reverse, and between two LWK enclaves. Every case must pass in every direction.
#[test]
fn the_conformance_cases_pass_across_enclaves_in_every_direction() {
    let Some(dir) = job_test_dir("clowderd-xemem-cross") else { return };
    let binary = lwk_job(&dir.0, "cross");
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    for name in ["a", "b"] {
        create_lwk_enclave(&socket, name, 1, "256M");
    }
    let listed = Command::new(&binary).arg("--list").output().unwrap();
    let cases: Vec<String> = String::from_utf8_lossy(&listed.stdout).lines().map(String::from).collect();
    assert!(cases.len() >= 9, "{cases:?}");
    let directions = [(Place::Host, Place::Lwk("b")), (Place::Lwk("a"), Place::Host), (Place::Lwk("a"), Place::Lwk("b"))];
    let (mut passed, mut failures) = (0, Vec::new());
    for (owner, attacher) in directions {
        for case in &cases {
            let label = format!("{owner:?} -> {attacher:?} {case}");
            let ((owner_ok, owner_out), (attacher_ok, attacher_out)) = std::thread::scope(|scope| {
                let owner_side = scope.spawn(|| run_cross_role(owner, "owner", case, &binary, &dir.0, &socket, &xemem_socket));
                let attacher_side = scope.spawn(|| run_cross_role(attacher, "attacher", case, &binary, &dir.0, &socket, &xemem_socket));
                (owner_side.join().unwrap(), attacher_side.join().unwrap())
            });
            if owner_ok && attacher_ok {
                println!("cross {label}: PASS");
                passed += 1;
            } else {
                println!("cross {label}: FAIL\n  owner: {owner_out}\n  attacher: {attacher_out}");
                failures.push(label);
            }
        }
    }
    println!("cross-enclave conformance: {passed} passed, {} failed", failures.len());
    assert!(failures.is_empty(), "failed: {failures:?}");
    remove_enclaves(&socket, &["a", "b"]);
}

/// Every process of an LWK job is an XEMEM process of its own (`xemem/tests/lwk_fork_device.c`,
/// in a connected enclave, so every id is the daemon's name server's): a fork child gets and
/// attaches its parent's segment and signals it, waking the parent's blocking read of its
/// notify descriptor; the child does not inherit the parent's attachment (SIGSEGV); the parent
/// attaches the child's named segment, and once the child exits its next touch is SIGBUS.
#[test]
fn forked_lwk_processes_use_the_device_and_signal_each_other() {
    let Some(dir) = job_test_dir("clowderd-xemem-fork") else { return };
    let job = lwk_job(&dir.0, "lwk_fork_device");
    let BrokeredDaemon { socket, .. } = start_daemon_with_broker(&dir.0);
    create_lwk_enclave(&socket, "forker", 1, "128M");
    let (reply, out) = run_job_to_end(&socket, "forker", &job, &["lwk_fork_device"], &dir.0);
    assert_eq!(reply["status"], 0, "{reply} {out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(out.contains("lwk_fork_device: all passed"), "{out}");
    assert_eq!(out.lines().filter(|line| line.starts_with("ok ")).count(), 32, "{out}");
    remove_enclaves(&socket, &["forker"]);
}

/// Where one party of `xemem/tests/notify_peer.c` runs.
enum Peer<'a> {
    Host,
    Enclave(&'a str),
}

/// Runs `notify_peer` twice, as the owner of `own` waiting on it (`wait`) or signalling
/// `peer` first (`signal`), one party per place; returns each party's (status, output).
fn run_notify_peers(tag: &str, parties: [(Peer<'_>, &str, &str, &str); 2]) -> Option<Vec<(String, String)>> {
    let dir = job_test_dir(&format!("clowderd-xemem-notify-{tag}"))?;
    let job = lwk_job(&dir.0, "notify_peer");
    let host_program = dir.0.join("notify_peer_host");
    support::build_host_program("notify_peer.c", &host_program);
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    for (place, ..) in &parties {
        if let Peer::Enclave(name) = place {
            create_lwk_enclave(&socket, name, 1, "128M");
        }
    }
    let results = std::thread::scope(|scope| {
        let runs: Vec<_> = parties
            .iter()
            .map(|(place, own, peer, role)| {
                let (job, host_program, dir, socket, xemem_socket) = (&job, &host_program, &dir.0, &socket, &xemem_socket);
                scope.spawn(move || match place {
                    Peer::Host => {
                        let (status, output) =
                            HostProcess::spawn(host_program, xemem_socket, &[own, peer, role]).finish(Duration::from_secs(60));
                        (format!("{status:?}"), output)
                    }
                    Peer::Enclave(name) => {
                        let (reply, stdout) = run_job_to_end(socket, name, job, &["notify_peer", own, peer, role], dir);
                        (format!("Some({})", reply["status"]), stdout)
                    }
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect::<Vec<_>>()
    });
    for (place, ..) in &parties {
        if let Peer::Enclave(name) = place {
            remove_enclaves(&socket, &[name]);
        }
    }
    Some(results)
}

/// Both parties made their segment, signalled the other's, woke once and exited 0.
fn assert_notified(results: &[(String, String)], names: [&str; 2]) {
    let context = format!("{results:#?}");
    for (index, (status, out)) in results.iter().enumerate() {
        let (own, peer) = (names[index], names[1 - index]);
        assert_eq!(status, "Some(0)", "{context}");
        assert!(out.contains(&format!("made {own}")), "{context}");
        assert!(out.contains(&format!("signalled {peer}")), "{context}");
        assert!(out.contains("woke 1"), "{context}");
        // The party that signals first waits with poll (the other with a blocking read).
        assert!(out.contains("polled readable") == (index == 1), "{context}");
        assert!(!out.contains("FAIL"), "{context}");
    }
}

/// XEMEM's signals between a host process (libxpmem, the daemon's broker) and an LWK job
/// (/dev/xpmem): the host attacher signals the job's segment, whose notify descriptor wakes
/// the job from a blocking read (Notify from the daemon's name server to the enclave's
/// node); the job then signals the host's segment through its bridged permit, and the host's
/// notify descriptor wakes.
#[test]
fn a_host_process_and_an_lwk_job_signal_each_others_segments() {
    let Some(results) = run_notify_peers(
        "host-lwk",
        [
            (Peer::Enclave("waiter"), "lwk-notify-seg", "host-notify-seg", "wait"),
            (Peer::Host, "host-notify-seg", "lwk-notify-seg", "signal"),
        ],
    ) else {
        return;
    };
    assert_notified(&results, ["lwk-notify-seg", "host-notify-seg"]);
}

/// The same between jobs in two enclaves: b's job signals a's segment through the daemon's
/// proxy permit, and a's job then signals b's.
#[test]
fn lwk_jobs_in_two_enclaves_signal_each_others_segments() {
    let Some(results) = run_notify_peers(
        "lwk-lwk",
        [
            (Peer::Enclave("a"), "lwk-a-notify-seg", "lwk-b-notify-seg", "wait"),
            (Peer::Enclave("b"), "lwk-b-notify-seg", "lwk-a-notify-seg", "signal"),
        ],
    ) else {
        return;
    };
    assert_notified(&results, ["lwk-a-notify-seg", "lwk-b-notify-seg"]);
}
