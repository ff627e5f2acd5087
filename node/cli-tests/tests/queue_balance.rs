//! Threads queued on a busy CPU move to the other one when it has fewer threads (issue 25:
//! four MPI ranks in a two-vCPU enclave). A runnable thread moved only to an idle CPU, and no
//! CPU takes threads queued on another, so with a rank spinning on each CPU the ranks' woken
//! helper threads piled up on one of them (nine behind one thread for tens of seconds, by the
//! kernel's stall notes) while the other ran its spinner alone. Here a thread spins bound to
//! CPU 1 and four others, bound to CPU 0 and then allowed both, spin: within 5 s one of the
//! four must run on CPU 1 ("balanced"; before: "all four stayed on cpu 0"). Needs /dev/kvm,
//! the LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

const BALANCE_JOB: &str = r#"#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile int on_cpu1, go;

static void bind(int first, int last) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = first; cpu <= last; cpu++) CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) _exit(20);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *hog(void *unused) {
    (void)unused;
    bind(1, 1); /* CPU 1 is never idle */
    for (;;) {}
}

static void *spinner(void *unused) {
    (void)unused;
    bind(0, 0);
    while (!go) {}
    bind(0, 1);
    for (;;) {
        for (volatile int n = 0; n < 100000; n++) {}
        if (sched_getcpu() == 1) on_cpu1 = 1;
    }
}

int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, hog, NULL) != 0) return 11;
    for (int i = 0; i < 4; i++)
        if (pthread_create(&thread, NULL, spinner, NULL) != 0) return 11;
    bind(0, 0);
    go = 1;
    int balanced = 0;
    for (double end = now() + 5; !balanced && now() < end;) {
        struct timespec nap = {0, 10000000};
        nanosleep(&nap, NULL);
        balanced = on_cpu1;
    }
    printf(balanced ? "balanced\n" : "all four stayed on cpu 0\n");
    fflush(stdout);
    _exit(!balanced); /* the spinning threads end with the process */
}
"#;

#[test]
fn threads_queued_behind_a_busy_cpu_move_to_a_less_busy_one() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-queue-balance", Liveness::default()) else { return };
    build_musl_program(&dir.0, "balance", BALANCE_JOB);
    run_clowder_ok(&socket, &["enclave", "create", "--name", "two", "--cores", "0,1", "--mem", "256M"], &dir.0);
    let output = run_clowder(&socket, &["run", "--enclave", "two", "./balance"], &dir.0);
    assert_eq!(text(&output.stdout), "balanced\n", "stderr: {}", text(&output.stderr));
    assert!(output.status.success(), "{:?}: {}", output.status, text(&output.stderr));
    run_clowder_ok(&socket, &["enclave", "rm", "two"], &dir.0);
}
