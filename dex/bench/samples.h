/* Timing samples for the DEX benchmark programs: a monotonic clock in nanoseconds and the
   median and percentiles of a set of samples, in microseconds. */
#ifndef DEX_BENCH_SAMPLES_H
#define DEX_BENCH_SAMPLES_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int compare_samples(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The `p` quantile (0 <= p < 1) of the `n` samples in `v` (sorted in place), in us. */
static double percentile_us(uint64_t *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof(*v), compare_samples);
	return v[(int)(n * p)] / 1000.0;
}

static double median_us(uint64_t *v, int n)
{
	return percentile_us(v, n, 0.5);
}

#endif
