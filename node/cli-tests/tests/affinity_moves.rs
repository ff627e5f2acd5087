//! `sched_setaffinity` of another thread that runs on another CPU (issue 25: Open MPI's and
//! hwloc's binding of helper threads). The LWK recorded the new CPU for the thread but left it
//! running where it was, tickless, for good, and made the *caller* give up its own CPU: the
//! recorded CPU then named the wrong one for a kill's tick and for timed waits. Here a child
//! spins bound to CPU 1 and the parent, bound to CPU 0, binds the child to CPU 0: the child
//! must come to run on CPU 0 within 3 s ("moved"; "still on cpu 1" before the fix). Needs
//! /dev/kvm, the LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use support::two_cpu_job_prints;

mod support;

/// The child binds itself to CPU 1 and spins, publishing the CPU it runs on with a count of
/// its reports. The parent binds itself to CPU 0, waits for a report from CPU 1, binds the
/// child to CPU 0, and then sleeps in short naps (leaving CPU 0 to the child) until a fresh
/// report says CPU 0, or 3 s pass.
const MOVE_JOB: &str = r#"#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "clowder_test.h"

struct shared { volatile int cpu; volatile long reports; };

/* Waits (napping 1 ms at a time) up to `seconds` for a report newer than `after` from `cpu`. */
static int report_from(struct shared *s, long after, int cpu, double seconds) {
    for (double end = now() + seconds; now() < end;) {
        if (s->reports > after && s->cpu == cpu) return 1;
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    return 0;
}

int main(void) {
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) return 10;
    s->cpu = -1;
    if (set_cpus(0, 0, 0) != 0) return 11;
    pid_t child = fork();
    if (child < 0) return 12;
    if (child == 0) {
        bind_cpus(1, 1);
        for (;;) {
            for (volatile int i = 0; i < 100000; i++) {}
            s->cpu = sched_getcpu();
            s->reports++;
        }
    }
    int result = 1;
    if (!report_from(s, 0, 1, 10)) {
        printf("child never ran on cpu 1\n");
    } else if (set_cpus(child, 0, 0) != 0) {
        printf("sched_setaffinity of the child failed\n");
    } else {
        long before = s->reports;
        int moved = report_from(s, before, 0, 3);
        printf(moved ? "moved\n" : "still on cpu %d\n", s->cpu);
        result = !moved;
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return result;
}
"#;

#[test]
fn a_running_thread_bound_elsewhere_moves() {
    two_cpu_job_prints("clowder-affinity-moves", "move", MOVE_JOB, "moved\n");
}
