//! Each LWK enclave numbers its processes in a range of its own above Linux's largest pid
//! (clowderd's `clowder.pid_base`): Open MPI's shared memory between ranks in two enclaves
//! hung while both numbered from 1 (each rank took the other's segment, made by a process with
//! its own pid, for its own). A job and its forked child in enclaves a and b: four different
//! pids, all above 2^22 and below 2^30 (futex lock words hold a thread id in 30 bits), the
//! child's parent its own leader. Needs /dev/kvm, the LWK image, clowder-vmm and musl-gcc;
//! skipped (with the reason) otherwise.

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// Prints `leader PID`, then its child's `child PID PPID`, then `tid TID` of the leader.
const PIDS_JOB: &str = r#"#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    printf("leader %d\n", getpid());
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        printf("child %d %d\n", getpid(), getppid());
        return 0;
    }
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child || status != 0) return 1;
    printf("tid %ld\n", (long)gettid());
    return 0;
}
"#;

/// The numbers after `word` in `output`'s line that starts with it.
fn numbers(output: &str, word: &str) -> Vec<u64> {
    let line = output.lines().find(|line| line.starts_with(word)).unwrap_or_else(|| panic!("no {word} line in {output:?}"));
    line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect()
}

#[test]
fn enclaves_number_their_processes_apart_from_each_other_and_the_host() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-pids", Liveness::default()) else { return };
    build_musl_program(&dir.0, "pids", PIDS_JOB);
    let mut seen = Vec::new();
    for name in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "create", "--name", name, "--cores", "1", "--mem", "128M"], &dir.0);
        let run = run_clowder(&socket, &["run", "--enclave", name, "./pids"], &dir.0);
        let output = text(&run.stdout);
        assert_eq!(run.status.code(), Some(0), "{output} {}", text(&run.stderr));
        let leader = numbers(&output, "leader")[0];
        let child = numbers(&output, "child");
        assert_eq!(numbers(&output, "tid"), vec![leader], "the leader's thread id is its pid");
        assert_eq!(child[1], leader, "the child's parent is the leader");
        seen.extend([leader, child[0]]);
    }
    assert!(seen.iter().all(|&pid| (1 << 22..1 << 30).contains(&pid)), "{seen:?}");
    let mut distinct = seen.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), seen.len(), "two processes share a pid: {seen:?}");
}
