//! Threads queued on a busy CPU move to the other one when it has fewer threads (issue 25:
//! four MPI ranks in a two-vCPU enclave). A runnable thread moved only to an idle CPU, and no
//! CPU takes threads queued on another, so with a rank spinning on each CPU the ranks' woken
//! helper threads piled up on one of them (nine behind one thread for tens of seconds, by the
//! kernel's stall notes) while the other ran its spinner alone. Here a thread spins bound to
//! CPU 1 and four others, bound to CPU 0 and then allowed both, spin: within 5 s one of the
//! four must run on CPU 1 ("balanced"; before: "all four stayed on cpu 0"). Needs /dev/kvm,
//! the LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use support::two_cpu_job_prints;

mod support;

const BALANCE_JOB: &str = r#"#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include "clowder_test.h"

static volatile int on_cpu1, go;

static void *hog(void *unused) {
    (void)unused;
    bind_cpus(1, 1); /* CPU 1 is never idle */
    for (;;) {}
}

static void *spinner(void *unused) {
    (void)unused;
    bind_cpus(0, 0);
    while (!go) {}
    bind_cpus(0, 1);
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
    bind_cpus(0, 0);
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
    two_cpu_job_prints("clowder-queue-balance", "balance", BALANCE_JOB, "balanced\n");
}
