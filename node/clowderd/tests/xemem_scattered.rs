//! An LWK job attaches a host segment whose owner's answer is single pages of one memfd in
//! scattered order (`host_scattered_owner`), as a Linux VM owner's is: the daemon adds them to
//! the enclave as ONE region (one memory slot of its VMM, `add_pieces`), and the job finds
//! every page where the owner wrote it, through every attach `lwk_host_attacher` makes. Needs
//! what xemem_lwk.rs needs; skipped, with the reason, otherwise.

use std::time::Duration;

mod support;
use support::processes::HostProcess;
use support::{
    create_lwk_enclave, job_test_programs, log_lines, regions_added_and_removed, remove_enclaves, run_job_to_end, start_daemon_with_broker,
    BrokeredDaemon,
};

/// 4001 pages: near the most runs a host owner's library answers with (WIRE_MAX_RUNS, 4096).
/// Added as a region per page, as before, they took the daemon 240-620 ms per attach, and the
/// enclave then stopped draining its channel for 5 s (the job never finished); as one region,
/// 22-27 ms.
#[test]
fn an_lwk_job_attaches_a_host_segment_of_scattered_pages_as_one_region() {
    const PAGES: u64 = 4001;
    let Some((dir, job, owner)) = job_test_programs("clowderd-xemem-scattered", "lwk_host_attacher", "host_scattered_owner") else {
        return;
    };
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    create_lwk_enclave(&socket, "scattered", 1, "128M");
    let host = HostProcess::owner(&owner, &xemem_socket, &[&PAGES.to_string()]);
    let (reply, stdout) = run_job_to_end(&socket, "scattered", &job, &["lwk_host_attacher", &PAGES.to_string()], &dir.0);
    let (host_status, host_rest) = host.finish(Duration::from_secs(60));
    let lines = log_lines(&socket, "scattered");
    let context = format!("{reply}\n{stdout}\nowner: {host_rest}\n{lines:#?}");
    assert_eq!(reply["status"], 0, "{context}");
    assert!(stdout.contains(&format!("{PAGES} of {PAGES} pages hold what the host wrote")), "{context}");
    assert!(stdout.contains(&format!("second attach: {PAGES} of {PAGES} pages, at the first one's address: 1")), "{context}");
    let tail = PAGES - 1;
    assert!(stdout.contains(&format!("all but the first page: {tail} of {tail} pages")), "{context}");
    assert!(stdout.contains(&format!("last attach: {PAGES} of {PAGES} pages")), "{context}");
    assert_eq!(host_status, Some(0), "{context}");
    assert!(host_rest.contains("the LWK wrote 43"), "{context}");
    // Three attaches reached the host (the whole segment, all but its first page, the whole
    // again): each one region of as many pieces as pages, each gone by the end.
    let joined = |pieces: u64| lines.iter().filter(|line| line.contains(&format!("bytes in {pieces} pieces) is region"))).count();
    assert_eq!((joined(PAGES), joined(tail)), (2, 1), "{context}");
    assert_eq!(regions_added_and_removed(&lines), (3, 3), "{context}");
    remove_enclaves(&socket, &["scattered"]);
}
