//! A thread whose forwarded file call waits for the host gives its CPU to the threads queued
//! for it (issue 25: four MPI ranks in one enclave). The LWK kept the CPU through the whole
//! wait, so on a loaded host, where an answer took up to seconds, the ranks' PMIx progress
//! threads stalled for over a second, past PMIx's 2 s finalize timer. Here, in a one-vCPU
//! enclave, the main thread reads 32 MiB of /dev/urandom at a time (a host answer of a good
//! 50 ms) while a second thread spins, noting the time at each round: that thread must have
//! run in the middle of a read ("ran during the reads"; before: "never ran during the reads",
//! as it could run only just before or just after each call). Needs /dev/kvm, the LWK image,
//! clowder-vmm and musl-gcc; skipped (with the reason) otherwise.

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// Five reads; for each, whether the spinner noted a time between 20 ms after the read began
/// and 20 ms before it ended (a time slice is 10 ms: before the fix it could run a slice just
/// before the call was made and one just after it returned, never inside it).
const WAIT_JOB: &str = r#"#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "clowder_test.h"

#define CHUNK (32 << 20)
#define MARGIN 0.02
#define NOTES 4096
static volatile double notes[NOTES]; /* the spinner's times, at most one a millisecond, a ring */
static volatile unsigned noted;
static volatile int stop;

static void *spin(void *unused) {
    (void)unused;
    for (double last = 0; !stop;) {
        double t = now();
        if (t - last > 0.001) notes[noted++ % NOTES] = last = t;
    }
    return NULL;
}

/* Whether the spinner noted a time in (from, to). */
static int spun_between(double from, double to) {
    for (int i = 0; i < NOTES; i++)
        if (notes[i] > from && notes[i] < to) return 1;
    return 0;
}

int main(void) {
    char *buffer = malloc(CHUNK);
    int fd = open("/dev/urandom", O_RDONLY);
    if (!buffer || fd < 0) return 10;
    for (int i = 0; i < CHUNK; i += 4096) buffer[i] = 0; /* its pages mapped before the reads */
    pthread_t spinner;
    if (pthread_create(&spinner, NULL, spin, NULL) != 0) return 11;
    while (noted == 0) {}
    int during = 0, longest_ms = 0;
    for (int round = 0; round < 5; round++) {
        double start = now();
        if (read(fd, buffer, CHUNK) != CHUNK) return 12;
        double end = now();
        if ((end - start) * 1000 > longest_ms) longest_ms = (end - start) * 1000;
        during += spun_between(start + MARGIN, end - MARGIN);
    }
    stop = 1;
    pthread_join(spinner, NULL);
    printf(during ? "ran during the reads\n" : "never ran during the reads (longest %d ms)\n", longest_ms);
    return during ? 0 : 1;
}
"#;

#[test]
fn a_thread_waiting_for_a_file_call_gives_its_cpu_away() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-file-call-waits", Liveness::default()) else { return };
    build_musl_program(&dir.0, "waits", WAIT_JOB);
    // The channel path, the one a loaded host takes: where the daemon polls the kernel's file
    // slots (an idle host) a call's answer is waited for on the CPU (slots and ring-3 calls
    // keep it; CI at load 4 saw "never ran", longest read 78 ms). Read at creation.
    std::env::set_var("CLOWDER_FILE_SLOTS", "off");
    std::env::set_var("CLOWDER_RING3_FILES", "off");
    run_clowder_ok(&socket, &["enclave", "create", "--name", "one", "--cores", "1", "--mem", "256M"], &dir.0);
    std::env::remove_var("CLOWDER_FILE_SLOTS");
    std::env::remove_var("CLOWDER_RING3_FILES");
    let output = run_clowder(&socket, &["run", "--enclave", "one", "./waits"], &dir.0);
    assert_eq!(text(&output.stdout), "ran during the reads\n", "stderr: {}", text(&output.stderr));
    assert!(output.status.success(), "{:?}: {}", output.status, text(&output.stderr));
    run_clowder_ok(&socket, &["enclave", "rm", "one"], &dir.0);
}
