//! A job's exit code and its death by a signal are told apart (enclave-proto's `JobExited`):
//! a job that calls `exit(130)` makes `clowder run` exit with 130, one killed by SIGINT makes
//! it die of SIGINT, in a persistent LWK enclave and a one-shot one. Before, the enclave sent
//! a shell's 128 + N for a signal, so `exit(130)` ended `clowder run` by SIGINT. (A Linux
//! enclave's jobs are checked the same way by `make test-linux-enclave`.) Needs /dev/kvm, the
//! LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use std::os::unix::process::ExitStatusExt;

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// Runs `./status` with `args` by `clowder run` with `run_args` first: its exit code, or the
/// signal it died of.
fn ended(socket: &std::path::Path, dir: &std::path::Path, run_args: &[&str], args: &[&str]) -> (Option<i32>, Option<i32>) {
    let output = run_clowder(socket, &[&["run"], run_args, &["./status"], args].concat(), dir);
    assert!(output.stdout.is_empty(), "stdout: {}", text(&output.stdout));
    (output.status.code(), output.status.signal())
}

#[test]
fn an_exit_code_above_128_is_not_a_signal() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-exit-status", Liveness::default()) else { return };
    build_musl_program(&dir.0, "status", include_str!("job_status.c"));
    run_clowder_ok(&socket, &["enclave", "create", "--name", "one", "--cores", "1", "--mem", "64M"], &dir.0);
    for run_args in [&["--enclave", "one"][..], &[][..]] {
        let place = if run_args.is_empty() { "a one-shot enclave" } else { "enclave one" };
        assert_eq!(ended(&socket, &dir.0, run_args, &["exit", "130"]), (Some(130), None), "exit(130) in {place}");
        assert_eq!(ended(&socket, &dir.0, run_args, &["exit", "137"]), (Some(137), None), "exit(137) in {place}");
        assert_eq!(ended(&socket, &dir.0, run_args, &["signal", "2"]), (None, Some(libc::SIGINT)), "SIGINT in {place}");
        assert_eq!(ended(&socket, &dir.0, run_args, &["exit", "3"]), (Some(3), None), "exit(3) in {place}");
    }
    let logs = text(&run_clowder_ok(&socket, &["logs", "one"], &dir.0).stdout);
    assert!(logs.contains("exited with status 130 (killed by signal 2)"), "{logs}");
    assert!(logs.contains("exited with status 130\n"), "{logs}");
    run_clowder_ok(&socket, &["enclave", "rm", "one"], &dir.0);
}
