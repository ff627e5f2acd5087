/*
 * selfish: the selfish-detour noise benchmark (after Beckman et al.), written for clowder.
 * Spins reading the clock for DURATION seconds; every gap between two consecutive readings
 * longer than THRESHOLD (default: 5x the smallest gap seen) is a detour: time the OS took away.
 *
 *   selfish [DURATION_S] [THRESHOLD_NS] [list]
 *
 * Prints the number of detours, the time lost and its fraction, and the largest detour; with
 * `list`, every detour after that as "detour AT_US LENGTH_US" (the first 100,000).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../args.h"

static inline uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

#define MAX_DETOURS 100000

int main(int argc, char **argv) {
    int list = argc > 3 && !strcmp(argv[3], "list");
    if ((argc > 3 && !list) || argc > 4) {
        fprintf(stderr, "usage: selfish [DURATION_S 0.001..3600] [THRESHOLD_NS (0: 5x the loop)] [list]\n");
        return 2;
    }
    double duration = argc > 1 ? arg_number("selfish", "DURATION_S", argv[1], 0.001, 3600) : 5.0;
    uint64_t threshold = argc > 2 ? (uint64_t)arg_integer("selfish", "THRESHOLD_NS", argv[2], 0, 1000000000L) : 0;
    /* Calibrate the undisturbed loop: the smallest gap over a short run. */
    uint64_t min_gap = UINT64_MAX, prev = now_ns();
    for (int i = 0; i < 1000000; i++) {
        uint64_t t = now_ns();
        if (t - prev < min_gap) min_gap = t - prev;
        prev = t;
    }
    if (min_gap == 0) min_gap = 1;
    if (threshold == 0) threshold = 5 * min_gap < 1000 ? 1000 : 5 * min_gap;

    static uint64_t detour_at[MAX_DETOURS], detour_len[MAX_DETOURS];
    long detours = 0;
    uint64_t lost = 0, start = now_ns(), end = start + (uint64_t)(duration * 1e9);
    prev = start;
    for (;;) {
        uint64_t t = now_ns();
        uint64_t gap = t - prev;
        if (gap > threshold) {
            if (detours < MAX_DETOURS) { detour_at[detours] = prev - start; detour_len[detours] = gap; }
            detours++;
            lost += gap;
        }
        prev = t;
        if (t >= end) break;
    }
    double elapsed = (prev - start) / 1e9;
    uint64_t largest = 0;
    for (long i = 0; i < detours && i < MAX_DETOURS; i++)
        if (detour_len[i] > largest) largest = detour_len[i];
    printf("selfish: %.2f s, loop %llu ns, threshold %llu ns\n", elapsed, (unsigned long long)min_gap,
           (unsigned long long)threshold);
    printf("selfish: %ld detours, %.3f ms lost (%.5f%% of the time), largest %.1f us\n", detours,
           lost / 1e6, 100.0 * lost / 1e9 / elapsed, largest / 1e3);
    for (long i = 0; list && i < detours && i < MAX_DETOURS; i++)
        printf("detour %.3f %.3f\n", detour_at[i] / 1e3, detour_len[i] / 1e3);
    return 0;
}
