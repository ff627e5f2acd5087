/*
 * syscall-loop: the round-trip cost of a trivial system call (getpid), measured from user space.
 *
 *   syscall-loop [ITERATIONS]     (default 100000)
 *
 * Issues getpid through syscall(2) so no libc caching can hide the kernel entry.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../args.h"

int main(int argc, char **argv) {
    if (argc > 2) {
        fprintf(stderr, "usage: syscall-loop [ITERATIONS >= 1]\n");
        return 2;
    }
    long iterations = argc > 1 ? arg_integer("syscall-loop", "ITERATIONS", argv[1], 1, 1000000000000L) : 100000;
    struct timespec a, b;
    long pid = syscall(SYS_getpid);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iterations; i++)
        if (syscall(SYS_getpid) != pid) return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / iterations;
    printf("syscall-loop: %ld getpid calls, %.1f ns each\n", iterations, ns);
    return 0;
}
