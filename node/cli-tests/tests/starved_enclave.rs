//! The daemon's Ping judgement on a loaded host (clowderd's enclave/ping.rs): the time an
//! enclave's first vCPU waited on a host run queue does not count (a runnable vCPU is judged
//! by the time it ran), since a loaded CI host once had a live enclave removed. Shown here: an
//! enclave whose vCPU is kept to slivers of its core stays and runs the next job, and a
//! stopped VMM, which is not runnable and waits on no run queue, is still found hung within a
//! timeout or two (the arithmetic is unit-tested there). Needs /dev/kvm, the LWK image,
//! clowder-vmm, musl-gcc, chrt and taskset (skipped, with the reason, otherwise).

mod support;

use std::process::{Child, Command};
use std::time::Duration;

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, skipped_without, text, vmm_pid};

const HELLO_JOB: &str = r#"
#include <stdio.h>
int main(void) { printf("still here\n"); return 0; }
"#;

/// Tiny, so that a starved vCPU's waits outlast it: judged by wall time the enclave was removed
/// (2 runs of 2 at load 10); judged as now it stays.
const PING_TIMEOUT: Duration = Duration::from_millis(20);

/// The id of `pid`'s thread called `name`.
fn thread_id(pid: u32, name: &str) -> String {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .find(|task| std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim_end() == name))
        .unwrap_or_else(|| panic!("clowder-vmm {pid} has no thread {name}"))
        .file_name()
        .into_string()
        .unwrap()
}

fn command_ok(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(output.status.success(), "{program} {args:?}: {}", text(&output.stderr));
    text(&output.stdout)
}

/// A shell spinning on host CPU `cpu` until killed.
struct Spinner(Child);

impl Spinner {
    fn on(cpu: &str) -> Spinner {
        Spinner(Command::new("taskset").args(["-c", cpu, "sh", "-c", "while :; do :; done"]).spawn().unwrap())
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_starved_enclave_is_slow_not_hung_and_a_stopped_one_is_hung() {
    if skipped_without("chrt", "to starve a vCPU") || skipped_without("taskset", "to share its core") {
        return;
    }
    let liveness = Liveness { ping_timeout: PING_TIMEOUT, ..Liveness::default() };
    let Some((dir, socket)) = enclave_test_daemon("clowder-starved", liveness) else { return };
    build_musl_program(&dir.0, "hello", HELLO_JOB);
    run_clowder_ok(&socket, &["enclave", "create", "--name", "starved", "--cores", "1", "--mem", "128M"], &dir.0);

    // The first vCPU at the lowest priority (SCHED_IDLE) beside a spinner on its own core, for
    // ten Ping timeouts: it runs in slivers between waits on the run queue.
    let pid = vmm_pid(&socket, &dir.0, "starved");
    let vcpu = thread_id(pid, "vcpu0");
    let affinity = command_ok("taskset", &["-pc", &vcpu]);
    let cpu = affinity.rsplit(':').next().unwrap().trim().split([',', '-']).next().unwrap().to_string();
    command_ok("chrt", &["-i", "-p", "0", &vcpu]);
    {
        let _spinner = Spinner::on(&cpu);
        std::thread::sleep(Duration::from_secs(10));
    }
    let logs = text(&run_clowder(&socket, &["logs", "starved"], &dir.0).stdout);
    assert!(!logs.contains("stopped answering Ping"), "{logs}");
    command_ok("chrt", &["-o", "-p", "0", &vcpu]);
    let run = run_clowder(&socket, &["run", "--enclave", "starved", "./hello"], &dir.0);
    assert_eq!(text(&run.stdout), "still here\n", "stderr: {}", text(&run.stderr));
    let logs = text(&run_clowder(&socket, &["logs", "starved"], &dir.0).stdout);
    assert!(!logs.contains("stopped answering Ping"), "{logs}");

    // A VMM that does not run at all waits on no run queue: its silence counts, and the
    // enclave goes.
    command_ok("kill", &["-STOP", &pid.to_string()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let hung = loop {
        let logs = text(&run_clowder(&socket, &["logs", "starved"], &dir.0).stdout);
        let hung = logs.contains("enclave starved failed: it stopped answering Ping");
        if hung || std::time::Instant::now() > deadline {
            break hung;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = Command::new("kill").args(["-CONT", &pid.to_string()]).status();
    let logs = text(&run_clowder(&socket, &["logs", "starved"], &dir.0).stdout);
    assert!(hung, "a stopped enclave was not found hung within 10 s: {logs}");
}
