//! Large anonymous regions in a persistent LWK enclave, as the in-situ simulation's recurring
//! workflow makes them (a new 512 MiB region every interval): mapping memory an earlier
//! `munmap` dirtied must give zeroed memory, and fast (the host clears it: in the LWK's kernel,
//! emulated on PVM, clearing 512 MiB took 45-56 s, past the daemon's 30 s ping timeout), and a
//! job must never see the previous job's data. The job is the LWK's differential test program
//! `large_regions.c` (every word checked zero before it is filled with a pattern). Needs
//! /dev/kvm, the LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use std::time::{Duration, Instant};

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

const LARGE_REGIONS_JOB: &str = include_str!("../../../kernels/lwk/tests/programs/large_regions.c");

#[test]
fn regions_of_512_mib_mapped_again_and_again_read_zero_within_and_across_jobs() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-large-regions", Liveness::default()) else { return };
    build_musl_program(&dir.0, "large_regions", LARGE_REGIONS_JOB);
    // The job's heap is about 3/4 of the enclave: two 512 MiB regions do not fit side by side,
    // so every round after the first maps memory the one before it filled.
    run_clowder_ok(&socket, &["enclave", "create", "--name", "regions", "--cores", "1", "--mem", "1280M"], &dir.0);
    for job in 0..2 {
        let started = Instant::now();
        let run = run_clowder(&socket, &["run", "--enclave", "regions", "./large_regions", "512", "3"], &dir.0);
        let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
        assert_eq!(run.status.code(), Some(0), "job {job}: {stdout}{stderr}");
        assert_eq!(stdout.matches("512 MiB mapped, 0 nonzero words").count(), 3, "job {job}: {stdout}");
        assert!(stdout.ends_with("ok\n"), "job {job}: {stdout}");
        // Seconds natively; a minute and more when the kernel clears it.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(30), "job {job} took {took:?}");
    }
    run_clowder_ok(&socket, &["enclave", "rm", "regions"], &dir.0);
}
