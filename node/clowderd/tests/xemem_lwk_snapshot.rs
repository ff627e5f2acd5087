//! XEMEM snapshots (TCASM) of LWK memory read by a host process (issue 28, point 3): an LWK
//! job publishes a snapshot of a region (page-table copy-on-write in the kernel), a host
//! process attaches it through the broker and reads the same data before and after the job
//! rewrote every page of the region, and the snapshot's name and segid go with its release,
//! after which the job finds the region's memory back. Needs what `xemem_lwk` needs
//! (/dev/kvm, musl-gcc, the LWK image, clowder-vmm); skipped, with the reason, otherwise.

use std::process::Command;

mod support;
use support::{create_lwk_enclave, job_test_programs, remove_enclaves, run_job, start_daemon_with_broker, BrokeredDaemon};

#[test]
fn a_host_reader_sees_the_snapshot_while_the_lwk_job_rewrites_it() {
    let Some((dir, job, reader)) = job_test_programs("clowderd-xemem-lwk-snapshot", "lwk_snapshot_writer", "host_snapshot_reader") else {
        return;
    };
    let BrokeredDaemon { socket, xemem_socket, .. } = start_daemon_with_broker(&dir.0);
    create_lwk_enclave(&socket, "sim", 1, "256M");
    let job_stdout = std::sync::Mutex::new(String::new());
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_job(&socket, "sim", &job, &["lwk_snapshot_writer"], &dir.0, &job_stdout));
        let host = Command::new(&reader).env("CLOWDER_XEMEM_SOCKET", &xemem_socket).output().unwrap();
        let reply = runner.join().unwrap();
        let host_out = String::from_utf8_lossy(&host.stdout);
        let stdout = job_stdout.lock().unwrap().clone();
        let context = format!("reader {:?}:\n{host_out}{}\njob {reply}:\n{stdout}", host.status, String::from_utf8_lossy(&host.stderr));
        assert!(host_out.contains("520 of 520 pages hold the snapshot\n"), "{context}");
        assert!(host_out.contains("520 of 520 pages hold the snapshot while the job rewrote them"), "{context}");
        assert!(host_out.contains("the released snapshot is gone"), "{context}");
        assert!(host.status.success(), "{context}");
        for line in ["rewrote every page", "the reader read it again", "released", "the region's memory is back"] {
            assert!(stdout.contains(&format!("{line}\n")), "{line}: {context}");
        }
        assert_eq!(reply["status"], 0, "{context}");
    });
    remove_enclaves(&socket, &["sim"]);
}
