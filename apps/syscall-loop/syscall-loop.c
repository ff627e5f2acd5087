/*
 * syscall-loop: the round-trip cost of a small system call, measured from user space.
 *
 *   syscall-loop [ITERATIONS [CALL]]     (default 100000 getpid)
 *
 * CALL is one of getpid, gettid, getppid, getuid, uname, getrusage, times, clock-cputime
 * (clock_gettime of CLOCK_PROCESS_CPUTIME_ID), clock_getres, getcpu, sched_yield. Every call
 * goes through syscall(2), so that no libc caching or vDSO can hide the kernel entry.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/times.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "../args.h"

static struct utsname name;
static struct rusage usage;
static struct tms tms_buffer;
static struct timespec timespec_buffer;
static unsigned cpu, node;

static const struct {
    const char *name;
    long number, a, b;
} calls[] = {
    { "getpid", SYS_getpid, 0, 0 },
    { "gettid", SYS_gettid, 0, 0 },
    { "getppid", SYS_getppid, 0, 0 },
    { "getuid", SYS_getuid, 0, 0 },
    { "uname", SYS_uname, (long)&name, 0 },
    { "getrusage", SYS_getrusage, RUSAGE_SELF, (long)&usage },
    { "times", SYS_times, (long)&tms_buffer, 0 },
    { "clock-cputime", SYS_clock_gettime, CLOCK_PROCESS_CPUTIME_ID, (long)&timespec_buffer },
    { "clock_getres", SYS_clock_getres, CLOCK_MONOTONIC, (long)&timespec_buffer },
    { "getcpu", SYS_getcpu, (long)&cpu, (long)&node },
    { "sched_yield", SYS_sched_yield, 0, 0 },
};

int main(int argc, char **argv) {
    if (argc > 3) {
        fprintf(stderr, "usage: syscall-loop [ITERATIONS >= 1 [CALL]]\n");
        return 2;
    }
    long iterations = argc > 1 ? arg_integer("syscall-loop", "ITERATIONS", argv[1], 1, 1000000000000L) : 100000;
    const char *wanted = argc > 2 ? argv[2] : "getpid";
    unsigned which = 0;
    while (which < sizeof calls / sizeof calls[0] && strcmp(calls[which].name, wanted) != 0)
        which++;
    if (which == sizeof calls / sizeof calls[0]) {
        fprintf(stderr, "syscall-loop: CALL must be one of getpid, gettid, getppid, getuid, uname, getrusage, times, "
                        "clock-cputime, clock_getres, getcpu, sched_yield, got \"%s\"\n", wanted);
        return 2;
    }
    long number = calls[which].number, a = calls[which].a, b = calls[which].b;
    long first = syscall(number, a, b);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < iterations; i++) {
        long result = syscall(number, a, b);
        /* The identity calls answer the same every time; the others succeed. */
        if (number == SYS_times ? result < 0 : result != first)
            return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / iterations;
    printf("syscall-loop: %ld %s calls, %.1f ns each\n", iterations, wanted, ns);
    return 0;
}
