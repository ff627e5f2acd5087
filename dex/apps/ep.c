/* EP: the NPB "embarrassingly parallel" kernel, ported to DEX.
 * Pairs of uniform deviates become Gaussian pairs (Marsaglia polar
 * method); the program counts them in ten square annuli and sums them.
 * The random stream is counter-based, so the result does not depend on how
 * samples are split over threads or nodes, and sums are kept in fixed point
 * so they are exact in any order.
 *
 * usage: ep [--naive] [threads] [log2 samples]
 *   default (optimised): each thread stages its tallies locally and writes
 *     them once into its own page-aligned slot.
 *   --naive: the first port: every thread updates its slot of one shared
 *     array (all slots on one page) for each accepted pair. */
#include <dex.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

#define ANNULI 10
#define FIXED_POINT 1e6

struct tally {
	int64_t counts[ANNULI];
	int64_t sum_x, sum_y; /* fixed point */
	int64_t accepted;
};

struct job {
	int index;
	uint64_t first, last;
	struct tally *slot;
	int naive;
};

static double uniform(uint64_t counter)
{
	return (double)(app_mix(counter) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

static void add_pair(struct tally *t, double x, double y)
{
	int annulus = (int)fmax(fabs(x), fabs(y));
	if (annulus < ANNULI)
		t->counts[annulus]++;
	t->sum_x += (int64_t)llround(x * FIXED_POINT);
	t->sum_y += (int64_t)llround(y * FIXED_POINT);
	t->accepted++;
}

static void *run(void *arg)
{
	struct job *job = arg;
	dex_migrate(job->index % dex_nodes()); /* DEX port: go to this thread's node */
	struct tally local;
	memset(&local, 0, sizeof(local));
	struct tally *target = job->naive ? job->slot : &local;
	for (uint64_t k = job->first; k < job->last; k++) {
		double x = uniform(2 * k), y = uniform(2 * k + 1);
		double t = x * x + y * y;
		if (t > 1.0 || t == 0.0)
			continue;
		double f = sqrt(-2.0 * log(t) / t);
		add_pair(target, x * f, y * f);
	}
	if (!job->naive)
		*job->slot = local;
	dex_migrate(0); /* DEX port: back to the origin */
	return NULL;
}

int main(int argc, char **argv)
{
	int naive;
	int arg = app_naive_flag(argc, argv, &naive);
	long threads = app_number(argc, argv, arg, 4);
	long log2_samples = app_number(argc, argv, arg + 1, 22);
	if (threads < 1 || threads > 256 || log2_samples < 0 || log2_samples > 62)
		return 2;
	uint64_t samples = 1ull << log2_samples;

	struct tally *slots;
	struct tally **slot_of = malloc(sizeof(*slot_of) * (size_t)threads);
	if (naive) {
		slots = calloc((size_t)threads, sizeof(*slots));
		for (int i = 0; i < threads; i++)
			slot_of[i] = &slots[i];
	} else {
		for (int i = 0; i < threads; i++) {
			slot_of[i] = dex_malloc_aligned(sizeof(struct tally));
			memset(slot_of[i], 0, sizeof(struct tally));
		}
	}
	struct job *jobs = malloc(sizeof(*jobs) * (size_t)threads);
	pthread_t *tids = malloc(sizeof(*tids) * (size_t)threads);
	for (int i = 0; i < threads; i++) {
		jobs[i] = (struct job){ i, samples * (uint64_t)i / (uint64_t)threads,
					samples * (uint64_t)(i + 1) / (uint64_t)threads, slot_of[i], naive };
		pthread_create(&tids[i], NULL, run, &jobs[i]);
	}
	struct tally total;
	memset(&total, 0, sizeof(total));
	for (int i = 0; i < threads; i++) {
		pthread_join(tids[i], NULL);
		for (int a = 0; a < ANNULI; a++)
			total.counts[a] += slot_of[i]->counts[a];
		total.sum_x += slot_of[i]->sum_x;
		total.sum_y += slot_of[i]->sum_y;
		total.accepted += slot_of[i]->accepted;
	}
	printf("EP samples=2^%ld pairs=%lld sx=%.6f sy=%.6f counts:", log2_samples, (long long)total.accepted,
	       total.sum_x / FIXED_POINT, total.sum_y / FIXED_POINT);
	for (int a = 0; a < ANNULI; a++)
		printf(" %lld", (long long)total.counts[a]);
	printf("\n");
	return 0;
}
