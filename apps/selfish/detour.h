/*
 * The selfish-detour loop (after Beckman et al.), shared by apps/selfish and the in-situ attach
 * noise run (apps/insitu/noise.c): spin reading the clock; every gap between two consecutive
 * readings longer than a threshold is a detour, time the OS took away.
 */
#ifndef CLOWDER_DETOUR_H
#define CLOWDER_DETOUR_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define DETOUR_MAX 100000 /* detours kept for listing; more are counted only */

struct detours {
    uint64_t min_gap, threshold; /* ns: the undisturbed loop, and what counts as a detour */
    long count;
    uint64_t lost, largest, elapsed; /* ns */
    uint64_t at[DETOUR_MAX], length[DETOUR_MAX]; /* ns from the start, ns */
};

static inline uint64_t detour_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

/* Spins for DURATION seconds; THRESHOLD 0 means 5x the smallest gap of a calibration run (at
 * least 1 us). */
static inline void detour_run(struct detours *d, double duration, uint64_t threshold) {
    uint64_t min_gap = UINT64_MAX, prev = detour_now_ns();
    for (int i = 0; i < 1000000; i++) {
        uint64_t t = detour_now_ns();
        if (t - prev < min_gap) min_gap = t - prev;
        prev = t;
    }
    if (min_gap == 0) min_gap = 1;
    if (threshold == 0) threshold = 5 * min_gap < 1000 ? 1000 : 5 * min_gap;
    d->min_gap = min_gap;
    d->threshold = threshold;
    d->count = 0;
    d->lost = d->largest = 0;
    uint64_t start = detour_now_ns(), end = start + (uint64_t)(duration * 1e9);
    prev = start;
    for (;;) {
        uint64_t t = detour_now_ns(), gap = t - prev;
        if (gap > threshold) {
            if (d->count < DETOUR_MAX) {
                d->at[d->count] = prev - start;
                d->length[d->count] = gap;
            }
            d->count++;
            d->lost += gap;
            if (gap > d->largest) d->largest = gap;
        }
        prev = t;
        if (t >= end) break;
    }
    d->elapsed = prev - start;
}

/* The summary lines, and with LIST every kept detour as "detour AT_US LENGTH_US". */
static inline void detour_print(const char *program, const struct detours *d, int list) {
    double elapsed = d->elapsed / 1e9;
    printf("%s: %.2f s, loop %llu ns, threshold %llu ns\n", program, elapsed, (unsigned long long)d->min_gap,
           (unsigned long long)d->threshold);
    printf("%s: %ld detours, %.3f ms lost (%.5f%% of the time), largest %.1f us\n", program, d->count, d->lost / 1e6,
           100.0 * d->lost / 1e9 / elapsed, d->largest / 1e3);
    for (long i = 0; list && i < d->count && i < DETOUR_MAX; i++)
        printf("detour %.3f %.3f\n", d->at[i] / 1e3, d->length[i] / 1e3);
}

#endif
