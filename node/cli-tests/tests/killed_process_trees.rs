//! Jobs of several processes killed from the host while their threads wait and spin on both
//! CPUs (issue 25: killing four MPI ranks in one two-vCPU enclave ended the enclave with
//! "panic: the calling thread's process"). Each round starts three jobs at once in one
//! two-vCPU enclave, each forking three children; every process has threads blocked in a
//! futex, poll, read and a timed sleep, one spinning, one creating short-lived threads, and
//! its main thread forking short-lived children, so that a kill meets threads in every state
//! and processes and threads being created. Both clients are killed (the daemon kills their
//! jobs); the next job must run, and the enclave's log must show no panic. Needs /dev/kvm,
//! the LWK image, clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{run_clowder, run_clowder_ok, text, two_cpu_enclave_with};

mod support;

/// `./tree`: four processes full of waiting, spinning and forking threads, "ready" once all
/// run; `./tree quick`: prints "next job ran".
const TREE_JOB: &str = r#"#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int quiet[2], started[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;

static void *in_futex(void *arg) { pthread_mutex_lock(&lock); for (;;) pthread_cond_wait(&never, &lock); return arg; }
static void *in_poll(void *arg) { struct pollfd p = { quiet[0], POLLIN, 0 }; for (;;) poll(&p, 1, -1); return arg; }
static void *in_read(void *arg) { char c; for (;;) read(quiet[0], &c, 1); return arg; }
static void *in_sleep(void *arg) { for (;;) usleep(2000); return arg; }
static void *spinning(void *arg) { for (;;) __asm__ volatile("pause"); return arg; }
static void *short_lived(void *arg) { return arg; }
static void *creating(void *arg) {
    for (;;) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, short_lived, NULL) == 0) pthread_join(thread, NULL);
    }
    return arg;
}

static void start_threads(void) {
    void *(*bodies[])(void *) = { in_futex, in_poll, in_read, in_sleep, spinning, creating };
    for (unsigned i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, bodies[i], NULL) != 0) _exit(30);
    }
}

static void forking(void) {
    for (;;) {
        pid_t child = fork();
        if (child == 0) { close(dup(2)); _exit(0); }
        if (child > 0) waitpid(child, NULL, 0);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "quick") == 0) { printf("next job ran\n"); return 0; }
    if (pipe(quiet) != 0 || pipe(started) != 0) return 10;
    for (int i = 0; i < 3; i++) {
        pid_t child = fork();
        if (child < 0) return 11;
        if (child == 0) {
            start_threads();
            write(started[1], "c", 1);
            forking();
        }
    }
    start_threads();
    for (int i = 0; i < 3; i++) { char c; if (read(started[0], &c, 1) != 1) return 12; }
    printf("ready\n");
    fflush(stdout);
    forking();
}
"#;

/// Jobs killed together per round (as `mpirun -n 4`'s ranks were: each a job of its own), and
/// rounds.
const JOBS: usize = 3;
const ROUNDS: usize = 2;

/// A process group killed from within the job while its processes fork: 500 times the job
/// starts a group of four forking processes, lets them run a moment and kills the group
/// (`kill(-group, SIGKILL)`), which meets children whose first thread does not exist yet. A
/// kill ended such a child at once, its thread then ran without its process ("panic: the
/// calling thread's process"). Prints how many groups ended killed. The job runs with an 8 MiB
/// heap: a fork copies its parent's memory at once, and with the default heap (most of the
/// enclave) the forks took 200 s at load 5 and over 40 minutes at load 10-15, and failed
/// (ENOMEM) once several processes lived at once.
const GROUP_KILL_JOB: &str = r#"#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 500
#define FORKERS 4

static void forking(void) {
    for (;;) {
        pid_t child = fork();
        if (child == 0) { close(dup(2)); _exit(0); }
        if (child > 0) waitpid(child, NULL, 0);
    }
}

int main(void) {
    int killed = 0;
    for (int round = 0; round < ROUNDS; round++) {
        pid_t first = fork();
        if (first < 0) { perror("fork"); return 10; }
        if (first == 0) {
            setpgid(0, 0);
            for (int i = 0; i < FORKERS - 1; i++)
                if (fork() == 0) break;
            forking();
        }
        setpgid(first, first);
        for (volatile int i = 0; i < 20000 + (round % 7) * 3000; i++) {}
        if (kill(-first, SIGKILL) != 0) return 12;
        int status;
        if (waitpid(first, &status, 0) == first && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) killed++;
    }
    while (wait(NULL) > 0) {}
    printf("%d groups killed\n", killed);
    return 0;
}
"#;

/// `clowder run --enclave ENCLAVE ./tree` once it printed "ready" (all four processes run).
fn start_tree(socket: &std::path::Path, dir: &std::path::Path, enclave: &str) -> Child {
    let mut client = Command::new(support::clowder())
        .args(["run", "--enclave", enclave, "--heap", "8M", "./tree"])
        .current_dir(dir)
        .env("CLOWDER_SOCKET", socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(client.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "the job did not start its processes");
    client
}

#[test]
fn process_groups_killed_while_forking_leave_the_enclave_usable() {
    let Some((dir, socket)) = two_cpu_enclave_with("clowder-group-kills", "group_kill", GROUP_KILL_JOB, "256M") else { return };
    let run = run_clowder(&socket, &["run", "--enclave", "two", "--heap", "8M", "./group_kill"], &dir.0);
    let logs = text(&run_clowder(&socket, &["logs", "two"], &dir.0).stdout);
    assert!(!logs.contains("panic"), "the enclave's kernel panicked:\n{logs}");
    assert_eq!(text(&run.stdout), "500 groups killed\n", "stderr: {}\nlogs:\n{logs}", text(&run.stderr));
    run_clowder_ok(&socket, &["enclave", "rm", "two"], &dir.0);
}

#[test]
fn jobs_of_busy_process_trees_killed_from_the_host_leave_the_enclave_usable() {
    let Some((dir, socket)) = two_cpu_enclave_with("clowder-killed-trees", "tree", TREE_JOB, "512M") else { return };
    for round in 1..=ROUNDS {
        let mut clients: Vec<Child> = (0..JOBS).map(|_| start_tree(&socket, &dir.0, "two")).collect();
        // Let the kill meet them mid-churn.
        std::thread::sleep(Duration::from_millis(300));
        for client in &mut clients {
            client.kill().unwrap();
            client.wait().unwrap();
        }
        // Until the daemon has noticed the clients are gone, the new job runs beside theirs.
        let deadline = Instant::now() + Duration::from_secs(30);
        let next = loop {
            let next = run_clowder(&socket, &["run", "--enclave", "two", "--heap", "8M", "./tree", "quick"], &dir.0);
            if next.status.success() || Instant::now() > deadline {
                break next;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let logs = text(&run_clowder(&socket, &["logs", "two"], &dir.0).stdout);
        assert!(!logs.contains("panic"), "round {round}: the enclave's kernel panicked:\n{logs}");
        assert_eq!(text(&next.stdout), "next job ran\n", "round {round}: stderr: {}\nlogs:\n{logs}", text(&next.stderr));
    }
    run_clowder_ok(&socket, &["enclave", "rm", "two"], &dir.0);
}
