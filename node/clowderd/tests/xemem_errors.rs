//! XEMEM errors whose reason the errno alone does not say reach the caller (issue 22, point
//! 8): a host process's attach of an LWK job's segment in a hugepage enclave that is not
//! whole, aligned 2 MiB pages fails with XPMEM's EINVAL, and libxpmem names the reason
//! (`xemem_errmsg`, and on stderr under CLOWDER_XEMEM_DEBUG=1) instead of leaving it in the
//! daemon's log alone. Needs what `xemem_lwk` needs plus 64 free 2 MiB hugepages (reserved
//! here and given back); skipped, with the reason, otherwise.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

mod support;
use support::hugepages::Reservation;
use support::{
    call, host_program, job_test_dir, lwk_job, lwk_xemem_id, remove_enclaves, run_job, skipped, start_daemon_with_broker, BrokeredDaemon,
};

#[test]
fn a_misaligned_attach_of_a_hugepage_enclaves_segment_says_why() {
    let Some(dir) = job_test_dir("clowderd-xemem-errors") else { return };
    let reservation = Reservation::free_pages(64);
    if skipped(reservation.as_ref().err().cloned()) {
        return;
    }
    let job = lwk_job(&dir.0, "lwk_named_owner");
    let attacher = host_program(&dir.0, "host_attacher");
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    let created = call(&socket, json!({"op": "create", "name": "huge", "cores": 1, "mem": "128M", "hugepages": true}));
    assert_eq!(created["ok"], true, "{created}");
    lwk_xemem_id(&socket, "huge", Duration::from_secs(10)).expect("the enclave got no XEMEM id");

    let job_stdout = std::sync::Mutex::new(String::new());
    std::thread::scope(|scope| {
        // The job's segment is 16 pages of 4 KiB: never whole 2 MiB pages of its RAM.
        let runner = scope.spawn(|| run_job(&socket, "huge", &job, &["lwk_named_owner"], &dir.0, &job_stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !job_stdout.lock().unwrap().contains("made a segment") {
            assert!(Instant::now() < deadline, "the job made no segment: {}", job_stdout.lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
        let host = Command::new(&attacher).env("CLOWDER_XEMEM_SOCKET", &xemem_socket).env("CLOWDER_XEMEM_DEBUG", "1").output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&host.stdout), String::from_utf8_lossy(&host.stderr));
        let context = format!("host_attacher {:?}:\n{stdout}\nstderr:\n{stderr}", host.status);
        assert_eq!(host.status.code(), Some(3), "the attach must fail: {context}");
        assert!(stdout.contains("attach failed: errno 22"), "XPMEM's errno: {context}");
        assert!(stdout.contains("because: the segment's memory is on 2 MiB pages"), "xemem_errmsg: {context}");
        assert!(stderr.contains("libxpmem: broker op 7 failed (Invalid argument): the segment's memory is on 2 MiB pages"), "{context}");
        // Removing the enclave ends the job, which waits for a write that never came.
        remove_enclaves(&socket, &["huge"]);
        let _ = runner.join();
    });
}
