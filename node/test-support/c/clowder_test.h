/*
 * What the C programs of the end-to-end tests share: binding to CPUs and a monotonic clock.
 * `build_musl_program` (src/lib.rs) writes this header beside every program it builds, and the
 * LWK's private-enclave tests (kernels/lwk/tests/lib) build with it on the include path, so a
 * program takes it with `#include "clowder_test.h"` (after `#define _GNU_SOURCE`).
 */
#ifndef CLOWDER_TEST_H
#define CLOWDER_TEST_H

#include <sched.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Lets thread or process `pid` (0: the caller) run on CPUs `first` to `last` only:
 * sched_setaffinity's result. */
static inline int set_cpus(pid_t pid, int first, int last) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = first; cpu <= last; cpu++) CPU_SET(cpu, &set);
    return sched_setaffinity(pid, sizeof set, &set);
}

/* Binds the calling thread to CPUs `first` to `last`; the process ends with status 20 if the
 * kernel refuses (a test cannot go on without it). */
static inline void bind_cpus(int first, int last) {
    if (set_cpus(0, first, last) != 0) _exit(20);
}

/* CLOCK_MONOTONIC in seconds (in an LWK job the vDSO's: no kernel entry). */
static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

#endif
