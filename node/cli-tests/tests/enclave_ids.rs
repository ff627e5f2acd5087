//! Forked processes and threads in two LWK enclaves of one node never share an id. A job's
//! first process has its `clowder run`'s host pid, but what it forks and the threads it makes
//! are numbered by the enclave, and every enclave numbered from 2^22: a wrapper script's child
//! in enclave a had the pid of the one in enclave b, which Open MPI's shared memory takes for
//! "my own segment" (docs/mpi.md), and files named after a pid in the shared /tmp collide.
//! clowderd now gives each enclave a block of ids of its own (`lwk.id_block`,
//! `lwk_core::ids`). Needs /dev/kvm, the LWK image, clowder-vmm and musl-gcc; skipped (with the
//! reason) otherwise.

use std::collections::BTreeSet;

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// Forks a child that starts a thread; prints the child's pid and the thread's id.
const IDS: &str = r#"#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
static void *report(void *unused) {
    (void)unused;
    printf("thread %ld\n", (long)syscall(SYS_gettid));
    return NULL;
}
int main(void) {
    pid_t child = fork();
    if (child < 0) return 10;
    if (child == 0) {
        pthread_t thread;
        printf("child %ld\n", (long)getpid());
        if (pthread_create(&thread, NULL, report, NULL) != 0) return 11;
        pthread_join(thread, NULL);
        fflush(stdout);
        _exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 12;
    return WEXITSTATUS(status);
}
"#;

const FIRST_KERNEL_ID: u64 = 1 << 22;
const FUTEX_TID_LIMIT: u64 = 1 << 30;

fn ids_in(socket: &std::path::Path, dir: &std::path::Path, enclave: &str) -> BTreeSet<u64> {
    let run = run_clowder(socket, &["run", "--enclave", enclave, "./ids"], dir);
    assert!(run.status.success(), "enclave {enclave}: {:?}, stderr: {}", run.status, text(&run.stderr));
    let ids: BTreeSet<u64> = text(&run.stdout)
        .lines()
        .map(|line| line.split_once(' ').and_then(|(_, id)| id.parse().ok()).unwrap_or_else(|| panic!("enclave {enclave}: {line:?}")))
        .collect();
    assert_eq!(ids.len(), 2, "enclave {enclave}: {}", text(&run.stdout));
    for id in &ids {
        assert!((FIRST_KERNEL_ID..FUTEX_TID_LIMIT).contains(id), "enclave {enclave}: id {id} is not above Linux's pids");
    }
    ids
}

#[test]
fn processes_and_threads_in_two_enclaves_never_share_an_id() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-enclave-ids", Liveness::default()) else { return };
    build_musl_program(&dir.0, "ids", IDS);
    for name in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "create", "--name", name, "--cores", "1", "--mem", "128M"], &dir.0);
    }
    let a = ids_in(&socket, &dir.0, "a");
    let b = ids_in(&socket, &dir.0, "b");
    assert!(a.is_disjoint(&b), "enclave a's ids {a:?} meet enclave b's {b:?}");
    // The enclave's next job numbers from the start of its block again.
    assert_eq!(ids_in(&socket, &dir.0, "a"), a);
    for name in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "rm", name], &dir.0);
    }
}
