//! Several jobs at once in one LWK enclave (issue 25 point 2: `mpirun -n 4 clowder run
//! --enclave a`): four `clowder run`s into a two-vCPU enclave, different programs from
//! different working directories, each with its own output stream, arguments, environment
//! and exit status; one crashes and one is killed (its client goes away) while the others
//! finish; then the enclave takes the next job. Needs /dev/kvm, the LWK image, clowder-vmm
//! and musl-gcc; skipped (with the reason) otherwise.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// `count NAME N STATUS`: prints `NAME i $WORD` for i < N, 20 ms apart (a timed wait), writes
/// `NAME` to `own.txt` in its working directory, and exits with STATUS.
const COUNT_JOB: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 4) return 100;
    const char *word = getenv("WORD");
    for (int i = 0; i < atoi(argv[2]); i++) {
        printf("%s %d %s\n", argv[1], i, word ? word : "-");
        fflush(stdout);
        usleep(20000);
    }
    FILE *own = fopen("own.txt", "w");
    if (!own || fprintf(own, "%s\n", argv[1]) < 0 || fclose(own) != 0) return 101;
    return atoi(argv[3]);
}
"#;

/// Prints a line, waits 300 ms and writes through a null pointer (SIGSEGV).
const CRASH_JOB: &str = r#"#include <stdio.h>
#include <unistd.h>
int main(void) {
    printf("about to crash\n");
    fflush(stdout);
    usleep(300000);
    *(volatile int *)0 = 1;
    return 0;
}
"#;

/// `clowder ARGS` started in `cwd` against the daemon at `socket`, its output piped.
fn start_clowder(socket: &Path, args: &[&str], cwd: &Path) -> Child {
    Command::new(support::clowder())
        .args(args)
        .current_dir(cwd)
        .env("CLOWDER_SOCKET", socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `clowder run` of `args` in the enclave `pair`, with a heap that lets four jobs fit.
fn run<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [&["run", "--enclave", "pair", "--heap", "32M"], args].concat()
}

/// What `count NAME N` prints with `word`.
fn counted(name: &str, lines: usize, word: &str) -> String {
    (0..lines).map(|i| format!("{name} {i} {word}\n")).collect()
}

/// Waits for `child`, at most `limit` (then kills it and fails).
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!("{what} did not end within {limit:?}; stdout: {}; stderr: {}", text(&output.stdout), text(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn four_jobs_share_a_two_vcpu_enclave_and_end_apart() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-several-jobs", Liveness::default()) else { return };
    build_musl_program(&dir.0, "count", COUNT_JOB);
    build_musl_program(&dir.0, "crash", CRASH_JOB);
    build_musl_program(&dir.0, "tick", &support::tick_job(50));
    let (a, b) = (dir.0.join("a"), dir.0.join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    run_clowder_ok(&socket, &["enclave", "create", "--name", "pair", "--cores", "0,1", "--mem", "512M"], &dir.0);

    // The ticking job first: the others start beside it.
    let mut tick = start_clowder(&socket, &run(&["../tick"]), &a);
    let mut first_line = String::new();
    BufReader::new(tick.stdout.as_mut().unwrap()).read_line(&mut first_line).unwrap();
    assert_eq!(first_line, "tick\n");
    let count_a = start_clowder(&socket, &run(&["--env", "WORD=alpha", "../count", "A", "40", "5"]), &a);
    let count_b = start_clowder(&socket, &run(&["--env", "WORD=beta", "../count", "B", "60", "6"]), &b);
    let crash = start_clowder(&socket, &run(&["./crash"]), &dir.0);

    // The crash ends its job alone (128 + SIGSEGV), the others still running.
    let crashed = finish(crash, Duration::from_secs(60), "the crashing job");
    assert_eq!(text(&crashed.stdout), "about to crash\n", "stderr: {}", text(&crashed.stderr));
    // The CLI dies of the job's signal, as a shell's child would.
    assert_eq!(crashed.status.signal(), Some(libc::SIGSEGV), "{:?}: {}", crashed.status, text(&crashed.stderr));
    // The ticking job's client goes away: its job is killed, the counting ones go on.
    tick.kill().unwrap();
    tick.wait().unwrap();

    let done_a = finish(count_a, Duration::from_secs(120), "job A");
    let done_b = finish(count_b, Duration::from_secs(120), "job B");
    assert_eq!(text(&done_a.stdout), counted("A", 40, "alpha"), "stderr: {}", text(&done_a.stderr));
    assert_eq!(done_a.status.code(), Some(5), "stderr: {}", text(&done_a.stderr));
    assert_eq!(text(&done_b.stdout), counted("B", 60, "beta"), "stderr: {}", text(&done_b.stderr));
    assert_eq!(done_b.status.code(), Some(6), "stderr: {}", text(&done_b.stderr));
    // Each job's files went to its own working directory.
    assert_eq!(std::fs::read_to_string(a.join("own.txt")).unwrap(), "A\n");
    assert_eq!(std::fs::read_to_string(b.join("own.txt")).unwrap(), "B\n");

    // The enclave is usable afterwards (once the killed job's end is in), and reports every
    // job's status in its log.
    let deadline = Instant::now() + Duration::from_secs(30);
    let next = loop {
        let next = run_clowder(&socket, &run(&["./count", "C", "2", "0"]), &dir.0);
        if next.status.code() == Some(0) || Instant::now() > deadline {
            break next;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(text(&next.stdout), counted("C", 2, "-"), "stderr: {}", text(&next.stderr));
    let logs = text(&run_clowder(&socket, &["logs", "pair"], &dir.0).stdout);
    for status in ["status 139", "status 137", "status 5", "status 6"] {
        assert!(logs.contains(&format!("exited with {status}")), "{status} missing from the log: {logs}");
    }
    run_clowder_ok(&socket, &["enclave", "rm", "pair"], &dir.0);
}
