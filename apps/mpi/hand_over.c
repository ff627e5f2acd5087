/*
 * hand_over: what it costs to pass one CPU between two ranks, without MPI. Two processes (or
 * two threads) take turns through a counter in shared memory; the one waiting for its turn
 * calls sched_yield, as Open MPI's progress loop does when oversubscribed (mpi_oversubscribe,
 * which mpirun sets when a node has more ranks than cores), or spins until the scheduler ends
 * its time slice. Four ranks in a two-vCPU enclave (docs/mpi.md, "Four ranks") wait on each
 * other so at every step of a collective.
 *
 *   hand_over ROUNDS yield|spin processes|threads
 *
 * Run it on one CPU (taskset -c 0 on the host; a one-vCPU enclave): prints
 *   hand_over: processes, yield: 1000 rounds, 2.5 us a hand-over, 1000 waits
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../args.h"

static volatile long *turn; /* even: party 0's turn, odd: party 1's */
static long rounds;
static int yield;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* ROUNDS turns of party `me`: the number of times it found the turn not yet its own. */
static long take_turns(int me) {
    long waits = 0;
    for (long i = 0; i < rounds; i++) {
        while ((*turn & 1) != me) {
            waits++;
            if (yield) sched_yield();
        }
        __sync_synchronize();
        (*turn)++;
    }
    return waits;
}

static void *party_one(void *unused) {
    (void)unused;
    take_turns(1);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[2], "yield") && strcmp(argv[2], "spin")) ||
        (strcmp(argv[3], "processes") && strcmp(argv[3], "threads"))) {
        fprintf(stderr, "usage: hand_over ROUNDS yield|spin processes|threads\n");
        return 2;
    }
    rounds = arg_integer("hand_over", "ROUNDS", argv[1], 1, 100000000);
    yield = !strcmp(argv[2], "yield");
    int threads = !strcmp(argv[3], "threads");
    turn = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (turn == MAP_FAILED) {
        perror("hand_over: mmap");
        return 1;
    }
    double start = now();
    pthread_t thread;
    pid_t child = -1;
    if (threads ? pthread_create(&thread, NULL, party_one, NULL) != 0 : (child = fork()) < 0) {
        perror("hand_over: a second party");
        return 1;
    }
    if (child == 0) {
        take_turns(1);
        _exit(0);
    }
    long waits = take_turns(0);
    if (threads)
        pthread_join(thread, NULL);
    else
        waitpid(child, NULL, 0);
    double took = now() - start;
    printf("hand_over: %s, %s: %ld rounds, %.1f us a hand-over, %ld waits\n", argv[3], argv[2], rounds,
           took / (2 * rounds) * 1e6, waits);
    return 0;
}
