/* BLK: Black-Scholes option pricing (after PARSEC's blackscholes), ported
 * to DEX. Threads price contiguous chunks of generated options; the output
 * is a checksum of all prices in fixed point (exact in any order).
 *
 * usage: blk [--naive] [threads] [options] [rounds]
 *   default (optimised): each thread writes prices into its own
 *     page-aligned output block and adds its checksum once.
 *   --naive: the first port: prices go to one shared array (chunk
 *     boundaries share pages) and each price is added to the shared global
 *     checksum at once. */
#include <dex.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

struct option {
	double spot, strike, rate, volatility, years;
	int is_put;
};

static struct option *options;
static double *shared_prices;
static long noptions = 1 << 18;
static int threads = 4, rounds = 4, naive;
static int64_t checksum;

static double cnd(double x)
{
	return 0.5 * erfc(-x / sqrt(2.0));
}

static double price(const struct option *o)
{
	double sq = o->volatility * sqrt(o->years);
	double d1 = (log(o->spot / o->strike) + (o->rate + 0.5 * o->volatility * o->volatility) * o->years) / sq;
	double d2 = d1 - sq;
	double discounted = o->strike * exp(-o->rate * o->years);
	if (o->is_put)
		return discounted * cnd(-d2) - o->spot * cnd(-d1);
	return o->spot * cnd(d1) - discounted * cnd(d2);
}

struct job {
	int index;
	long first, last;
};

static void *work(void *arg)
{
	struct job *job = arg;
	dex_migrate(job->index % dex_nodes()); /* DEX port: go to this thread's node */
	long n = job->last - job->first;
	double *out = naive ? shared_prices + job->first : dex_malloc_aligned(sizeof(double) * (size_t)n);
	int64_t local = 0;
	for (int r = 0; r < rounds; r++) {
		for (long i = 0; i < n; i++) {
			out[i] = price(&options[job->first + i]);
			int64_t fixed = llround(out[i] * 1e4);
			if (r == rounds - 1) {
				if (naive)
					__atomic_fetch_add(&checksum, fixed, __ATOMIC_RELAXED);
				else
					local += fixed;
			}
		}
	}
	if (!naive) {
		__atomic_fetch_add(&checksum, local, __ATOMIC_RELAXED);
		free(out);
	}
	dex_migrate(0); /* DEX port: back to the origin */
	return NULL;
}

static double unit(uint64_t seed)
{
	return (double)(app_mix(seed) >> 11) / 9007199254740992.0;
}

int main(int argc, char **argv)
{
	int arg = app_naive_flag(argc, argv, &naive);
	threads = (int)app_number(argc, argv, arg, threads);
	noptions = app_number(argc, argv, arg + 1, noptions);
	rounds = (int)app_number(argc, argv, arg + 2, rounds);
	if (threads < 1 || threads > 256 || noptions < threads || rounds < 1)
		return 2;
	options = malloc(sizeof(*options) * (size_t)noptions);
	for (long i = 0; i < noptions; i++) {
		uint64_t s = (uint64_t)i * 8;
		options[i] = (struct option){ 20 + 80 * unit(s), 20 + 80 * unit(s + 1), 0.01 + 0.09 * unit(s + 2),
					      0.05 + 0.6 * unit(s + 3), 0.1 + 2 * unit(s + 4), (int)(app_mix(s + 5) & 1) };
	}
	if (naive)
		shared_prices = malloc(sizeof(double) * (size_t)noptions);
	struct job *jobs = malloc(sizeof(*jobs) * (size_t)threads);
	pthread_t *tids = malloc(sizeof(*tids) * (size_t)threads);
	for (int t = 0; t < threads; t++) {
		jobs[t] = (struct job){ t, noptions * t / threads, noptions * (t + 1) / threads };
		pthread_create(&tids[t], NULL, work, &jobs[t]);
	}
	for (int t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	printf("BLK options=%ld rounds=%d checksum=%lld\n", noptions, rounds, (long long)checksum);
	return 0;
}
