/* A thread whose file call the host serves through a file slot or from ring 3 gives its CPU to
 * the thread queued for it. On the enclave's one CPU, rounds: the main thread makes two small
 * reads of /dev/urandom (through the slots: the host's pump then polls them, as in a busy job,
 * and takes the next call at once); then a second thread, which spins keeping the times it ran,
 * naps 10 ms, and meanwhile the main thread, alone, reads 32 MiB (0.05-0.3 s of the host's
 * work). A round counts if the napper's nap ended during the big read, 40 ms or more before its
 * end; in it the napper "ran" if it ran between its nap's end and 20 ms before the read's end:
 * a thread that keeps its CPU through the call lets it run only after. Rounds go on until 6
 * count, or 32 were made (a fast host's reads may be too short to count). Prints "the napper
 * ran in N of M rounds that count (longest read L ms)"; tests/file-slot-waits.sh wants M >= 3
 * and N >= M / 2. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "clowder_test.h"

#define ROUNDS 32
#define ENOUGH 6 /* rounds that count */
#define CHUNK (32 << 20)
#define TIMES 8192

static volatile double ran_at[TIMES]; /* a ring of the spinner's times, one a millisecond */
static volatile unsigned runs;
static volatile int nap_asked, napping, done;
static volatile double wake_due; /* when the napper's nap ends (it may run later) */

static void *spinner(void *unused) {
    (void)unused;
    double last = 0;
    while (!done) {
        if (nap_asked) {
            nap_asked = 0;
            struct timespec nap = {0, 10000000};
            wake_due = now() + 0.01;
            napping = 1;
            nanosleep(&nap, NULL);
        }
        double t = now();
        if (t - last >= 0.001) ran_at[runs++ % TIMES] = last = t;
    }
    return NULL;
}

static int spinner_ran_within(double from, double to) {
    for (unsigned i = 0; i < TIMES; i++)
        if (ran_at[i] > from && ran_at[i] < to) return 1;
    return 0;
}

int main(void) {
    char *buffer = malloc(CHUNK);
    int fd = open("/dev/urandom", O_RDONLY);
    pthread_t thread;
    if (!buffer || fd < 0 || pthread_create(&thread, NULL, spinner, NULL) != 0) return 10;
    for (size_t i = 0; i < CHUNK; i += 4096) buffer[i] = 1; /* mapped before the reads */
    int counted = 0, ran = 0;
    double longest = 0;
    for (int round = 0; round < ROUNDS && counted < ENOUGH; round++) {
        for (int i = 0; i < 2; i++)
            if (read(fd, buffer, 1) != 1) return 11;
        napping = 0;
        nap_asked = 1;
        while (!napping) {
        }
        double start = now();
        if (read(fd, buffer, CHUNK) != CHUNK) return 11;
        double end = now();
        if (end - start > longest) longest = end - start;
        if (wake_due > start && wake_due < end - 0.04) {
            counted++;
            ran += spinner_ran_within(wake_due, end - 0.02);
        }
    }
    done = 1;
    pthread_join(thread, NULL);
    printf("the napper ran in %d of %d rounds that count (longest read %.0f ms)\n", ran, counted, longest * 1000);
    return 0;
}
