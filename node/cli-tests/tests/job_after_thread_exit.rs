//! A persistent LWK enclave's next job after a job that a thread other than the main one
//! ended (`exit` from a pthread: exit_group on that thread's kernel stack). The job's end
//! frees every thread's kernel stack; the next job's main thread must take its traps on its
//! own stack, not on the one the CPU's last thread left in the TSS. It did: the new job's
//! system calls landed on a freed stack that the job's own thread stacks and page tables then
//! reused, and thread_arenas' second job crashed the kernel (a kernel page fault or #GP) or
//! hung it, in 1 to 4 runs of 10. One vCPU makes the last thread of the first job certain.
//! Needs /dev/kvm, the LWK image, clowder-vmm and musl-gcc; skipped (with the reason)
//! otherwise.

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// `stacks end-from-thread`: a thread ends the job with `exit(3)` while the main thread sleeps.
/// `stacks threads`: four threads and the main thread each make 2000 system calls and check
/// their results; prints `threads ok` if every thread returned what it was given.
const STACKS: &str = r#"#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *end_job(void *unused) {
    (void)unused;
    usleep(20000);
    exit(3);
}
static long calls(long seed) {
    long pid = getpid(), sum = seed;
    for (int i = 0; i < 2000; i++) {
        if (getpid() != pid) return -1;
        sum += i & 1;
    }
    return sum;
}
static void *worker(void *seed) {
    return (void *)calls((long)seed);
}
int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "end-from-thread") == 0) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, end_job, NULL) != 0) return 10;
        for (;;) pause();
    }
    pthread_t threads[4];
    for (long i = 0; i < 4; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)(i * 10000)) != 0) return 11;
    long own = calls(-1000);
    for (long i = 0; i < 4; i++) {
        void *result;
        if (pthread_join(threads[i], &result) != 0) return 12;
        if ((long)result != i * 10000 + 1000) {
            printf("thread %ld returned %ld\n", i, (long)result);
            return 13;
        }
    }
    if (own != 0) {
        printf("main counted %ld\n", own);
        return 14;
    }
    printf("threads ok\n");
    return 0;
}
"#;

#[test]
fn the_job_after_one_a_thread_ended_runs_its_threads() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-job-after-thread-exit", Liveness::default()) else { return };
    build_musl_program(&dir.0, "stacks", STACKS);
    run_clowder_ok(&socket, &["enclave", "create", "--name", "one", "--cores", "1", "--mem", "256M"], &dir.0);
    for round in 0..3 {
        let ended = run_clowder(&socket, &["run", "--enclave", "one", "./stacks", "end-from-thread"], &dir.0);
        assert_eq!(ended.status.code(), Some(3), "round {round}: stderr: {}", text(&ended.stderr));
        let next = run_clowder(&socket, &["run", "--enclave", "one", "./stacks", "threads"], &dir.0);
        let logs = || text(&run_clowder(&socket, &["logs", "one"], &dir.0).stdout);
        assert_eq!(text(&next.stdout), "threads ok\n", "round {round}: stderr: {}\nenclave log:\n{}", text(&next.stderr), logs());
        assert!(next.status.success(), "round {round}: {:?}", next.status);
    }
    run_clowder_ok(&socket, &["enclave", "rm", "one"], &dir.0);
}
