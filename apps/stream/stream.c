/*
 * stream: STREAM-style memory bandwidth (copy, scale, add, triad) over three arrays of N doubles,
 * written for clowder (not McCalpin's code, the same four kernels and the same accounting).
 *
 *   stream [N] [REPEATS]      (defaults: 20,000,000 doubles = 160 MB per array, 20 repeats)
 *
 * For each kernel prints the best, median and worst bandwidth over the repeats (MB/s, 10^6
 * bytes, counting each array read or written once per element). Verifies the final values.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../args.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc > 3) {
        fprintf(stderr, "usage: stream [N >= 1000] [REPEATS 2..1000]\n");
        return 2;
    }
    long n = argc > 1 ? arg_integer("stream", "N", argv[1], 1000, 4000000000L) : 20000000L;
    int repeats = argc > 2 ? (int)arg_integer("stream", "REPEATS", argv[2], 2, 1000) : 20;
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    double *times[4];
    for (int k = 0; k < 4; k++) times[k] = malloc(repeats * sizeof(double));
    if (!a || !b || !c) {
        fprintf(stderr, "stream: cannot allocate 3 x %ld doubles\n", n);
        return 2;
    }
    const double scalar = 3.0;
    for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }
    for (int r = 0; r < repeats; r++) {
        double t = now();
        for (long i = 0; i < n; i++) c[i] = a[i];
        times[0][r] = now() - t;
        t = now();
        for (long i = 0; i < n; i++) b[i] = scalar * c[i];
        times[1][r] = now() - t;
        t = now();
        for (long i = 0; i < n; i++) c[i] = a[i] + b[i];
        times[2][r] = now() - t;
        t = now();
        for (long i = 0; i < n; i++) a[i] = b[i] + scalar * c[i];
        times[3][r] = now() - t;
    }
    /* Expected values after `repeats` rounds, computed the same way on scalars. */
    double ea = 1.0, eb = 2.0, ec = 0.0;
    for (int r = 0; r < repeats; r++) { ec = ea; eb = scalar * ec; ec = ea + eb; ea = eb + scalar * ec; }
    int ok = 1;
    for (long i = 0; i < n; i += n / 1000)
        if (a[i] != ea || b[i] != eb || c[i] != ec) ok = 0;

    const char *names[4] = {"copy", "scale", "add", "triad"};
    const double arrays[4] = {2, 2, 3, 3};
    printf("stream: %ld doubles per array (%.1f MB), %d repeats\n", n, n * 8 / 1e6, repeats);
    printf("%-6s %12s %12s %12s\n", "kernel", "best MB/s", "median MB/s", "worst MB/s");
    for (int k = 0; k < 4; k++) {
        /* skip the first repeat (warm-up) as STREAM does */
        qsort(times[k] + 1, repeats - 1, sizeof(double), by_value);
        double bytes = arrays[k] * 8.0 * n;
        double best = times[k][1], median = times[k][1 + (repeats - 1) / 2], worst = times[k][repeats - 1];
        printf("%-6s %12.1f %12.1f %12.1f\n", names[k], bytes / best / 1e6, bytes / median / 1e6, bytes / worst / 1e6);
    }
    printf("stream: %s\n", ok ? "results verified" : "results WRONG");
    return ok ? 0 : 1;
}
