//! Ranks sharing an enclave spread over its CPUs (issue 25 point 2: `mpirun -n 4 clowder run
//! --enclave a`). Open MPI's hwloc binds each rank's main thread to every CPU in turn and then
//! to all of them; the LWK kept a thread on its CPU for good, so every rank ended on the last
//! CPU, time-sliced there, while the other CPU idled, and four ranks never got through
//! `MPI_Init`. Here a job and its forked child do the same and spin: they must come to run on
//! the two vCPUs at once, and, once both are bound to one CPU, never leave it. A job that ends
//! on CPU 1 hands its end to CPU 0, and its kernel-entry counts are logged once. Needs /dev/kvm,
//! the LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use support::{run_clowder, run_clowder_ok, text, two_cpu_enclave_with, two_cpu_job_prints};

mod support;

/// Parent and child bind themselves to CPU 0, CPU 1, then both (as hwloc does), and spin,
/// each publishing the CPU it runs on with a count of its reports in shared memory. The parent
/// waits (10 s at most) until it sees a fresh report of the child's from the other CPU
/// ("apart"). Then both bind to CPU 1 alone and spin for 300 ms: any report of CPU 0 is a
/// failure ("left CPU 1").
const SPREAD_JOB: &str = r#"#define _GNU_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "clowder_test.h"

struct shared { volatile int cpu[2]; volatile long reports[2]; volatile int phase; volatile int strayed; };

/* Spins a while, then reports the CPU it runs on (which must be 1 once `bound`). */
static void step(struct shared *s, int me, int bound) {
    for (volatile int i = 0; i < 200000; i++) {}
    int cpu = sched_getcpu();
    s->cpu[me] = cpu;
    s->reports[me]++;
    if (bound && cpu != 1) s->strayed = 1;
}

int main(void) {
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) return 10;
    s->cpu[0] = s->cpu[1] = -1;
    pid_t child = fork();
    if (child < 0) return 11;
    int me = child == 0;
    bind_cpus(0, 0);
    bind_cpus(1, 1);
    bind_cpus(0, 1);
    if (me == 1) {
        while (s->phase < 2) step(s, 1, 0);
        bind_cpus(1, 1);
        s->phase = 3;
        while (s->phase < 4) step(s, 1, 1);
        _exit(0);
    }
    int apart = 0;
    for (double end = now() + 10; !apart && now() < end;) {
        long seen = s->reports[1];
        step(s, 0, 0);
        apart = s->reports[1] != seen && s->cpu[1] >= 0 && s->cpu[1] != s->cpu[0];
    }
    printf(apart ? "apart\n" : "together on cpu %d\n", s->cpu[0]);
    s->phase = 2;
    while (s->phase < 3) step(s, 0, 0);
    bind_cpus(1, 1);
    for (double end = now() + 0.3; now() < end;) step(s, 0, 1);
    s->phase = 4;
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 12;
    printf(s->strayed ? "left cpu 1\n" : "stayed on cpu 1\n");
    return apart && !s->strayed ? 0 : 1;
}
"#;

/// Three processes pass a token round a ring of pipes 500 times, each spinning a little
/// before passing it on: their threads block and are woken all the time, often onto the other
/// CPU. A woken thread read its wait's outcome on the CPU it had waited on, which after a move
/// ran another thread or none ("panic: a thread runs on this CPU").
const RING_JOB: &str = r#"#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>

/* Three processes pass a token round a ring of pipes, each spinning a little before passing it
 * on: threads block and are woken all the time while the other CPU is busy or idle. */
int main(void) {
    int pipes[3][2];
    for (int i = 0; i < 3; i++)
        if (pipe(pipes[i]) != 0) return 10;
    for (int me = 1; me < 3; me++) {
        pid_t pid = fork();
        if (pid < 0) return 11;
        if (pid == 0) {
            char token;
            for (;;) {
                if (read(pipes[me][0], &token, 1) != 1) _exit(20);
                if (token == 'q') { write(pipes[(me + 1) % 3][1], &token, 1); _exit(0); }
                for (volatile int i = 0; i < 20000 * me; i++) {}
                if (write(pipes[(me + 1) % 3][1], &token, 1) != 1) _exit(21);
            }
        }
    }
    char token = 't';
    int rounds = 0;
    for (; rounds < 500; rounds++) {
        if (write(pipes[1][1], &token, 1) != 1) break;
        if (read(pipes[0][0], &token, 1) != 1) break;
    }
    token = 'q';
    write(pipes[1][1], &token, 1);
    read(pipes[0][0], &token, 1);
    int ended = 0, status;
    while (wait(&status) > 0) ended += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%d rounds, %d children ended\n", rounds, ended);
    return rounds == 500 && ended == 2 ? 0 : 1;
}
"#;

#[test]
fn processes_bound_in_turn_spread_over_the_cpus() {
    two_cpu_job_prints("clowder-spread-cpus", "spread", SPREAD_JOB, "apart\nstayed on cpu 1\n");
}

#[test]
fn threads_woken_onto_the_other_cpu_carry_on() {
    two_cpu_job_prints("clowder-woken-elsewhere", "ring", RING_JOB, "500 rounds, 2 children ended\n");
}

/// Binds itself to CPU 1 and ends there.
const END_ON_CPU1_JOB: &str = r#"#define _GNU_SOURCE
#include <stdio.h>
#include "clowder_test.h"

int main(void) {
    bind_cpus(1, 1);
    printf("on cpu %d\n", sched_getcpu());
    return 0;
}
"#;

#[test]
fn a_job_ended_on_cpu_1_logs_its_kernel_entries_once() {
    let Some((dir, socket)) = two_cpu_enclave_with("clowder-end-on-cpu1", "cpu1", END_ON_CPU1_JOB, "256M") else { return };
    let output = run_clowder(&socket, &["run", "--enclave", "two", "./cpu1"], &dir.0);
    assert_eq!(text(&output.stdout), "on cpu 1\n", "stderr: {}", text(&output.stderr));
    assert!(output.status.success(), "{:?}: {}", output.status, text(&output.stderr));
    let logs = text(&run_clowder_ok(&socket, &["logs", "two"], &dir.0).stdout);
    for line in ["job's kernel entries:", "job's most frequent system calls:"] {
        assert_eq!(logs.matches(line).count(), 1, "{line:?} in the enclave's log:\n{logs}");
    }
    run_clowder_ok(&socket, &["enclave", "rm", "two"], &dir.0);
}
