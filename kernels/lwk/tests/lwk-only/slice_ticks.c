/* A thread that spins in user mode, making a system call now and then (the kernel path), on
 * the one CPU of a persistent enclave, while a second thread sleeps 1 s at a time (nanosleep,
 * then poll with a timeout, as MPI libraries' progress threads wait): each time the sleeper's
 * wait ends it must get the CPU within a time slice or two, not at the spinner's next kernel
 * entry. Prints the sleeper's worst lateness and exits 0 if it was under 200 ms.
 * tests/slice-ticks.sh also checks the kernel's stall notes: a run of the spinner alone is not
 * a stall, only the time others waited for its CPU is. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "clowder_test.h"

#define ROUNDS 4

static volatile int stop;

static void *sleeper(void *result) {
    double worst = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double start = now();
        if (round % 2 == 0) {
            struct timespec second = {1, 0};
            nanosleep(&second, NULL);
        } else {
            poll(NULL, 0, 1000);
        }
        double late = now() - start - 1;
        if (late > worst) worst = late;
    }
    *(double *)result = worst;
    stop = 1;
    return NULL;
}

int main(void) {
    double worst = 0;
    pthread_t thread;
    if (pthread_create(&thread, NULL, sleeper, &worst) != 0) return 11;
    unsigned long calls = 0;
    for (double next = now(); !stop;) {
        if (now() >= next) {
            struct rusage usage; /* RUSAGE_CHILDREN: never a fast call */
            getrusage(RUSAGE_CHILDREN, &usage);
            calls++;
            next = now() + 0.005;
        }
    }
    pthread_join(thread, NULL);
    printf("worst lateness %.0f ms after %lu system calls of the spinner\n", worst * 1000, calls);
    return worst < 0.2 ? 0 : 1;
}
