/*
 * spawn-loop: the cost of creating processes and threads, measured from user space (the
 * kernel's page-table pages, kernel stacks and address-space copies are allocated and freed
 * on each one).
 *
 *   spawn-loop [ITERATIONS [WIDTH]]     (default 200 rounds, 4 at once)
 *
 * Each round forks WIDTH children that exit at once and waits for them, then creates WIDTH
 * threads that return at once and joins them. Prints the median and mean microseconds per
 * fork (fork + exit + wait) and per thread (create + exit + join).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../args.h"

static void *returns(void *arg) { return arg; }

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *samples, long rounds, long width) {
    double total = 0;
    for (long i = 0; i < rounds; i++)
        total += samples[i];
    qsort(samples, rounds, sizeof *samples, by_value);
    printf("spawn-loop: %s: %ld x %ld, median %.1f us, mean %.1f us each\n", what, rounds, width,
           samples[rounds / 2] / width, total / rounds / width);
}

int main(int argc, char **argv) {
    if (argc > 3) {
        fprintf(stderr, "usage: spawn-loop [ITERATIONS >= 1 [WIDTH 1-64]]\n");
        return 2;
    }
    long rounds = argc > 1 ? arg_integer("spawn-loop", "ITERATIONS", argv[1], 1, 10000000) : 200;
    long width = argc > 2 ? arg_integer("spawn-loop", "WIDTH", argv[2], 1, 64) : 4;
    double *forks = malloc(rounds * sizeof *forks), *threads = malloc(rounds * sizeof *threads);
    if (!forks || !threads)
        return 1;
    for (long round = 0; round < rounds; round++) {
        double start = now_us();
        for (long i = 0; i < width; i++) {
            pid_t child = fork();
            if (child == 0)
                _exit(0);
            if (child < 0) {
                perror("spawn-loop: fork");
                return 1;
            }
        }
        for (long i = 0; i < width; i++) {
            int status;
            if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return 1;
        }
        forks[round] = now_us() - start;

        pthread_t made[64];
        start = now_us();
        for (long i = 0; i < width; i++)
            if (pthread_create(&made[i], NULL, returns, NULL) != 0) {
                fprintf(stderr, "spawn-loop: pthread_create failed\n");
                return 1;
            }
        for (long i = 0; i < width; i++)
            pthread_join(made[i], NULL);
        threads[round] = now_us() - start;
    }
    report("fork", forks, rounds, width);
    report("thread", threads, rounds, width);
    return 0;
}
