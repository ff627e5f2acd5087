/* Timing on a shared machine (apps/mpi's benchmarks): a size's iterations run in BLOCKS blocks,
   each timed, and the median block counts, so that the few times the host's scheduler takes a
   rank's CPU away (other work on the same two cores) do not swamp a mean of microseconds. Host
   and enclave ranks are timed alike. */
#ifndef APPS_MPI_TIMING_H
#define APPS_MPI_TIMING_H

#include <stdlib.h>

enum { BLOCKS = 10 };

/* Iterations per block for about `iters` in all (at least one). */
static inline long per_block(long iters) { return iters / BLOCKS > 0 ? iters / BLOCKS : 1; }

static int compare_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the BLOCKS block times (sorted in place). */
static inline double median_block(double seconds[BLOCKS]) {
    qsort(seconds, BLOCKS, sizeof seconds[0], compare_seconds);
    return (seconds[BLOCKS / 2 - 1] + seconds[BLOCKS / 2]) / 2;
}

#endif
