//! A persistent LWK enclave end to end: the daemon (in this process, on a socket in a temp
//! directory named by CLOWDER_SOCKET, as `end_to_end.rs` starts it) boots the LWK without a
//! job, the kernel speaks `enclave-proto` on its channel, and the `clowder` CLI creates the
//! enclave, runs jobs in it (output streamed, exit status returned, files written in the
//! working directory appearing on the host, input files read), keeps it alive through a job
//! that spins past the ping timeout, and removes it. Needs /dev/kvm, the LWK image,
//! clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::{build_musl_program, TempDir, TOUCH_HEAP_JOB};
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// Writes to stdout and stderr, copies an input file into a new file of the working
/// directory (open, fstat, read, write, lseek, close, stat, access on host files), makes a
/// directory and a scratch file in it (mkdir, pwrite, ftruncate, unlink), reports getcwd, and
/// exits with 3.
const FILES_JOB: &str = r#"#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    printf("hello %s\n", argc > 1 ? argv[1] : "nobody");
    fprintf(stderr, "to stderr\n");
    char line[100] = "";
    FILE *input = fopen("input.txt", "r");
    if (!input || !fgets(line, sizeof line, input)) return 10;
    fclose(input);
    FILE *output = fopen("result.txt", "w");
    if (!output) return 11;
    fprintf(output, "copied: %s", line);
    for (int i = 0; i < 3000; i++) fprintf(output, "%04d\n", i);
    if (fclose(output) != 0) return 12;
    FILE *again = fopen("result.txt", "r");
    if (!again || fseek(again, 0, SEEK_END) != 0) return 13;
    printf("result.txt has %ld bytes\n", ftell(again));
    fclose(again);
    struct stat status;
    if (stat("result.txt", &status) != 0 || access("result.txt", W_OK) != 0) return 14;
    printf("stat: %ld bytes\n", (long)status.st_size);
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return 15;
    fprintf(stderr, "cwd %s\n", cwd);
    if (mkdir("made", 0755) != 0 && errno != EEXIST) return 16;
    int fd = open("made/scratch", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || pwrite(fd, "abc", 3, 10) != 3 || ftruncate(fd, 5) != 0 || fstat(fd, &status) != 0) return 17;
    if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_WRONLY) return 19;
    printf("scratch: %ld bytes\n", (long)status.st_size);
    if (close(fd) != 0 || unlink("made/scratch") != 0 || access("made/scratch", F_OK) == 0) return 18;
    return 3;
}
"#;

/// Spins in user mode for `argv[1]` seconds without a system call (the clock is the vDSO's).
const SPIN_JOB: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int seconds = argc > 1 ? atoi(argv[1]) : 1;
    do clock_gettime(CLOCK_MONOTONIC, &now); while (now.tv_sec - start.tv_sec < seconds);
    printf("spun %d s\n", seconds);
    return 0;
}
"#;

/// Sleeps 6 s (a timed wait: the kernel's idle loop polls the clock with interrupts off).
const SLEEP_JOB: &str = r#"#include <stdio.h>
#include <unistd.h>
int main(void) {
    sleep(6);
    printf("slept\n");
    return 0;
}
"#;

#[test]
fn a_persistent_enclave_runs_jobs_serves_their_files_and_stays_alive() {
    // A 5 s ping timeout, which the 7 s spinning job below outlasts.
    let liveness = Liveness { ping_timeout: Duration::from_secs(5), ..Liveness::default() };
    let Some((dir, socket)) = enclave_test_daemon("clowder-persistent", liveness) else { return };
    build_musl_program(&dir.0, "files", FILES_JOB);
    build_musl_program(&dir.0, "spin", SPIN_JOB);
    build_musl_program(&dir.0, "tick", &support::tick_job(100));
    build_musl_program(&dir.0, "sleep", SLEEP_JOB);
    std::fs::write(dir.0.join("input.txt"), "the input\n").unwrap();

    run_clowder_ok(&socket, &["enclave", "create", "--name", "e", "--cores", "1", "--mem", "256M"], &dir.0);

    // ./files with `word`: what it writes, and its status (3), which is the CLI's.
    let run_files = |word: &str| {
        let run = run_clowder(&socket, &["run", "--enclave", "e", "--file", "input.txt", "./files", word], &dir.0);
        let expected = format!("hello {word}\nresult.txt has 15018 bytes\nstat: 15018 bytes\nscratch: 5 bytes\n");
        assert_eq!(text(&run.stdout), expected, "stderr: {}", text(&run.stderr));
        assert_eq!(run.status.code(), Some(3), "the job's status is the CLI's");
        run
    };
    let run = run_files("world");
    assert!(text(&run.stderr).contains("to stderr"), "stderr: {}", text(&run.stderr));
    // getcwd is the host directory the job was launched from.
    assert!(text(&run.stderr).contains(&format!("cwd {}\n", dir.0.display())), "stderr: {}", text(&run.stderr));
    let result = std::fs::read_to_string(dir.0.join("result.txt")).expect("the job's output file is on the host");
    assert!(result.starts_with("copied: the input\n0000\n0001\n"), "{}", &result[..40.min(result.len())]);
    assert!(result.ends_with("2999\n"));
    assert!(dir.0.join("made").is_dir() && !dir.0.join("made/scratch").exists(), "mkdir and unlink reach the host");

    // The same enclave runs the next job: the first one's memory came back.
    run_files("again");

    // A job spinning longer than the ping timeout (5 s) in user mode: the kernel answers the
    // daemon's pings from the channel interrupt, so the enclave is not declared hung.
    let spin = run_clowder(&socket, &["run", "--enclave", "e", "./spin", "7"], &dir.0);
    assert_eq!(text(&spin.stdout), "spun 7 s\n", "stderr: {}", text(&spin.stderr));
    assert_eq!(spin.status.code(), Some(0));
    // The same while the job sleeps: the idle loop serves the channel as it polls.
    let sleep = run_clowder(&socket, &["run", "--enclave", "e", "./sleep"], &dir.0);
    assert_eq!(text(&sleep.stdout), "slept\n", "stderr: {}", text(&sleep.stderr));
    let listing = run_clowder(&socket, &["enclave", "ls"], &dir.0);
    assert!(text(&listing.stdout).contains('e'), "{}", text(&listing.stdout));

    // A client that goes away gets its job killed (KillJob); the enclave takes the next job.
    let mut ticking = Command::new(support::clowder())
        .args(["run", "--enclave", "e", "./tick"])
        .current_dir(&dir.0)
        .env("CLOWDER_SOCKET", &socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(ticking.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
    assert_eq!(first_line, "tick\n");
    ticking.kill().unwrap();
    ticking.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let after_kill = loop {
        let run = run_clowder(&socket, &["run", "--enclave", "e", "--file", "input.txt", "./files", "after-kill"], &dir.0);
        if run.status.code() == Some(3) || Instant::now() > deadline {
            break run;
        }
        // Until the daemon notices the client is gone the enclave is busy with the old job.
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        text(&after_kill.stdout),
        "hello after-kill\nresult.txt has 15018 bytes\nstat: 15018 bytes\nscratch: 5 bytes\n",
        "stderr: {}",
        text(&after_kill.stderr)
    );
    // Jobs share the enclave, so the next job need not wait for the killed one to end.
    let deadline = Instant::now() + Duration::from_secs(10);
    let logs = loop {
        let logs = run_clowder(&socket, &["logs", "e"], &dir.0);
        if text(&logs.stdout).contains("exited with status 137") || Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(text(&logs.stdout).contains("exited with status 137"), "{}", text(&logs.stdout));

    run_clowder_ok(&socket, &["enclave", "rm", "e"], &dir.0);
    let listing = run_clowder(&socket, &["--json", "enclave", "ls"], &dir.0);
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(listing["enclaves"], serde_json::json!([]), "{listing}");
}

/// Two threads, each reporting the CPU it runs on (`sched_getcpu`); the worker then spins in
/// user mode for ever, so it is still running on its CPU when `main` returns and the job
/// ends (the kernel must stop it there before the next job).
const CPUS_JOB: &str = r#"#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
static volatile int worker_cpu = -1;
static void *worker(void *arg) {
    (void)arg;
    worker_cpu = sched_getcpu();
    for (;;) __asm__ volatile("pause");
    return NULL;
}
int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) return 10;
    while (worker_cpu < 0) sched_yield();
    printf("main on cpu %d, worker on cpu %d\n", sched_getcpu(), worker_cpu);
    return 0;
}
"#;

/// A daemon with the job `program` built from `source`, and the two-vCPU enclave `enclave` created
/// for it; None (skipped) where enclaves cannot boot.
fn two_vcpu_enclave_with(program: &str, enclave: &str, source: &str) -> Option<(TempDir, PathBuf)> {
    let (dir, socket) = enclave_test_daemon(&format!("clowder-persistent-{program}"), Liveness::default())?;
    build_musl_program(&dir.0, program, source);
    run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--cores", "0,1", "--mem", "256M"], &dir.0);
    Some((dir, socket))
}

#[test]
fn a_two_vcpu_persistent_enclave_runs_threaded_jobs_on_both_cpus_one_after_another() {
    let Some((dir, socket)) = two_vcpu_enclave_with("cpus", "pair", CPUS_JOB) else { return };
    // Each job leaves its worker spinning on CPU 1 when it ends: the kernel parks that CPU
    // and brings it back for the next job, which uses both CPUs again.
    for round in 1..=3 {
        let run = run_clowder(&socket, &["run", "--enclave", "pair", "./cpus"], &dir.0);
        assert_eq!(text(&run.stdout), "main on cpu 0, worker on cpu 1\n", "round {round}, stderr: {}", text(&run.stderr));
        assert_eq!(run.status.code(), Some(0), "round {round}");
    }
    let listing = run_clowder(&socket, &["enclave", "ls"], &dir.0);
    assert!(text(&listing.stdout).contains("pair"), "the enclave is still up: {}", text(&listing.stdout));
    run_clowder_ok(&socket, &["enclave", "rm", "pair"], &dir.0);
}

/// One job per mode, each ending in a way that used to stop the machine, or reporting the
/// kernel's free memory:
/// - `exit-on-cpu1`: a thread moved to CPU 1 calls `exit` (exit_group) there: status 21;
/// - `thread-exit`: the only thread ends with the `exit` system call: status 22;
/// - `thread-exit-on-cpu1`: main ends with `exit`, then the last thread, on CPU 1, too: 23;
/// - `deadlock`: the only thread waits on a futex nobody can wake: the kernel ends it, 137;
/// - `family`: a forked child executes this program again (`child`: status 24) with its
///   stdout on a pipe the parent reads; the parent ends with the child's status;
/// - `memory`: a thread and a child process come and go, then the free memory (`sysinfo`) is
///   printed in KiB.
const ENDINGS_JOB: &str = r#"#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static void move_to_cpu1(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(1, &set);
    sched_setaffinity(0, sizeof set, &set);
}
static void *exit_group_on_cpu1(void *arg) {
    (void)arg;
    move_to_cpu1();
    printf("worker on cpu %d\n", sched_getcpu());
    fflush(stdout);
    exit(21);
}
static void *last_exit_on_cpu1(void *arg) {
    (void)arg;
    move_to_cpu1();
    struct timespec pause = {0, 100000000};
    nanosleep(&pause, NULL); /* main's exit comes first */
    syscall(SYS_exit, 23);
    return NULL;
}
static void *nothing(void *arg) { return arg; }
int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    pthread_t thread;
    if (strcmp(mode, "exit-on-cpu1") == 0) {
        pthread_create(&thread, NULL, exit_group_on_cpu1, NULL);
        pthread_join(thread, NULL);
    } else if (strcmp(mode, "thread-exit") == 0) {
        syscall(SYS_exit, 22);
    } else if (strcmp(mode, "thread-exit-on-cpu1") == 0) {
        pthread_create(&thread, NULL, last_exit_on_cpu1, NULL);
        syscall(SYS_exit, 0);
    } else if (strcmp(mode, "deadlock") == 0) {
        static int word;
        syscall(SYS_futex, &word, 0 /* FUTEX_WAIT */, 0, NULL);
    } else if (strcmp(mode, "family") == 0) {
        int fds[2];
        if (pipe(fds) != 0) return 30;
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fds[1], 1);
            close(fds[0]);
            char *args[] = {"endings", "child", NULL};
            execv("/proc/self/exe", args);
            _exit(98);
        }
        close(fds[1]);
        char said[64] = {0};
        read(fds[0], said, sizeof said - 1);
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 31;
        printf("child said: %s", said);
        return WEXITSTATUS(status);
    } else if (strcmp(mode, "child") == 0) {
        printf("hello through the pipe\n");
        return 24;
    } else if (strcmp(mode, "memory") == 0) {
        pthread_create(&thread, NULL, nothing, NULL);
        pthread_join(thread, NULL);
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        waitpid(pid, NULL, 0);
        struct sysinfo info;
        sysinfo(&info);
        printf("%lu\n", info.freeram * info.mem_unit / 1024);
        return 0;
    }
    return 99;
}
"#;

#[test]
fn a_two_vcpu_persistent_enclave_survives_every_way_a_job_ends_and_does_not_leak() {
    let Some((dir, socket)) = two_vcpu_enclave_with("endings", "ends", ENDINGS_JOB) else { return };

    let cases = [
        ("exit-on-cpu1", 21, "worker on cpu 1\n"),
        ("thread-exit", 22, ""),
        ("thread-exit-on-cpu1", 23, ""),
        ("deadlock", 137, ""),
        ("family", 24, "child said: hello through the pipe\n"),
    ];
    for (mode, status, output) in cases {
        let run = run_clowder(&socket, &["run", "--enclave", "ends", "--heap", "16M", "./endings", mode], &dir.0);
        // A job killed by signal N ends `clowder run` by that signal (so launchers see it): a
        // shell's 128+N.
        let seen = run.status.code().or(run.status.signal().map(|signal| 128 + signal));
        assert_eq!(seen, Some(status), "{mode}: stdout {} stderr {}", text(&run.stdout), text(&run.stderr));
        assert_eq!(text(&run.stdout), output, "{mode}");
    }

    // Many jobs in a row: with a fixed heap, the kernel's free memory seen by each job must
    // not fall (page tables, kernel stacks, the idle stack and child processes come back).
    let mut free_kib = Vec::new();
    for round in 0..32 {
        let run = run_clowder(&socket, &["run", "--enclave", "ends", "--heap", "16M", "./endings", "memory"], &dir.0);
        if run.status.code() != Some(0) {
            let logs = run_clowder(&socket, &["logs", "ends"], &dir.0);
            panic!("round {round}: status {:?}: {}; enclave log:\n{}", run.status.code(), text(&run.stderr), text(&logs.stdout));
        }
        free_kib.push(text(&run.stdout).trim().parse::<u64>().expect("free memory in KiB"));
    }
    // The kernel's own heap moves a few pages up and down from job to job; one page lost per
    // job would be 120 KiB over these 30 jobs.
    let median = |jobs: &[u64]| {
        let mut sorted = jobs.to_vec();
        sorted.sort_unstable();
        sorted[sorted.len() / 2]
    };
    let (early, late) = (median(&free_kib[1..6]), median(&free_kib[27..32]));
    assert!(late + 64 >= early, "free memory fell from {early} KiB to {late} KiB over 30 jobs: {free_kib:?}");

    let listing = run_clowder(&socket, &["enclave", "ls"], &dir.0);
    assert!(text(&listing.stdout).contains("ends"), "the enclave is still up: {}", text(&listing.stdout));
    run_clowder_ok(&socket, &["enclave", "rm", "ends"], &dir.0);
}

#[test]
fn an_enclave_larger_than_the_boot_window_runs_big_jobs_one_after_another_on_cleared_memory() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-persistent-big", Liveness::default()) else { return };
    build_musl_program(&dir.0, "bigheap", TOUCH_HEAP_JOB);
    // Beyond the first GiB (which the kernel's boot tables map whole) lie more RAM and, at the
    // top, the reserved channel the kernel attaches first.
    run_clowder_ok(&socket, &["enclave", "create", "--name", "big", "--cores", "1", "--mem", "1536M"], &dir.0);
    // Each job writes every page it touches; the next one must find them zero again. The
    // kernel has the host clear a finished job's memory (ZeroMemory): clearing 1000 MiB in
    // emulated kernel code would take longer than the daemon waits for a Pong.
    for round in 0..3 {
        let run = run_clowder(&socket, &["run", "--enclave", "big", "./bigheap", "1000"], &dir.0);
        assert_eq!(text(&run.stdout), "touched 1000 MiB, sum 0\n", "round {round}, stderr: {}", text(&run.stderr));
        assert_eq!(run.status.code(), Some(0));
    }
    run_clowder_ok(&socket, &["enclave", "rm", "big"], &dir.0);
}
