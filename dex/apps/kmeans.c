/* KMN: k-means clustering of 2-D integer points, ported to DEX.
 * Threads own contiguous chunks of points, assign each to the nearest
 * centre and accumulate per-cluster sums, which are combined into new
 * centres every iteration. Integer arithmetic keeps the result identical
 * for any number of threads and nodes.
 *
 * usage: kmeans [--naive] [threads] [points] [clusters] [iterations]
 *   default (optimised): each thread stages its sums locally and publishes
 *     them once per iteration on its own page; after one barrier every
 *     thread combines all sums into its own copy of the centres.
 *   --naive: the first port: partial sums of all threads side by side in one
 *     array, updated per point, one global "changed" flag written by every
 *     thread whenever a point moves, and thread 0 combining the sums into
 *     the shared centres between two barriers. */
#include <dex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

#define MAX_CLUSTERS 128

struct partial {
	int64_t sum_x[MAX_CLUSTERS], sum_y[MAX_CLUSTERS], count[MAX_CLUSTERS];
	int64_t changed;
};

static int threads = 4, clusters = 8, iterations = 10;
static long npoints = 200000;
static int naive;
static int32_t *px, *py;
static int8_t *membership; /* each point's cluster: MAX_CLUSTERS fits in a byte */
static int64_t centre_x[MAX_CLUSTERS], centre_y[MAX_CLUSTERS];
/* optimised: one page per thread, two sets used in alternate iterations */
static struct partial **partials[2];
static struct partial *naive_partials, **naive_partial_of;
static long changed_flag; /* naive: shared across threads */
static long moves_total;
static pthread_barrier_t barrier;

static int nearest(const int64_t *cx, const int64_t *cy, int k, int32_t x, int32_t y)
{
	int best = 0;
	int64_t best_d = INT64_MAX;
	for (int c = 0; c < k; c++) {
		int64_t dx = x - cx[c], dy = y - cy[c];
		int64_t d = dx * dx + dy * dy;
		if (d < best_d) {
			best_d = d;
			best = c;
		}
	}
	return best;
}

/* New centres (integer means; a cluster without points keeps its centre)
 * from the sums of `nthreads` threads; returns the points that moved. */
static long combine(struct partial *const *parts, int nthreads, int k, int64_t *cx, int64_t *cy)
{
	long moved = 0;
	for (int c = 0; c < k; c++) {
		int64_t sx = 0, sy = 0, n = 0;
		for (int t = 0; t < nthreads; t++) {
			sx += parts[t]->sum_x[c];
			sy += parts[t]->sum_y[c];
			n += parts[t]->count[c];
		}
		if (n) {
			cx[c] = sx / n;
			cy[c] = sy / n;
		}
	}
	for (int t = 0; t < nthreads; t++)
		moved += parts[t]->changed;
	return moved;
}

static void naive_iterations(int index, long first, long last)
{
	struct partial *mine = &naive_partials[index];
	for (int it = 0; it < iterations; it++) {
		memset(mine, 0, sizeof(*mine));
		for (long i = first; i < last; i++) {
			int c = nearest(centre_x, centre_y, clusters, px[i], py[i]);
			if (c != membership[i]) {
				membership[i] = (int8_t)c;
				changed_flag++;
			}
			mine->sum_x[c] += px[i];
			mine->sum_y[c] += py[i];
			mine->count[c]++;
		}
		pthread_barrier_wait(&barrier);
		if (index == 0)
			combine(naive_partial_of, threads, clusters, centre_x, centre_y);
		pthread_barrier_wait(&barrier);
	}
}

/* Inputs and centres are read into locals, so between barriers a thread
 * touches only its points and its own sums' page: one barrier and one
 * exchange of sums per iteration cross nodes. A thread writes a set of
 * sums two iterations after its last use, when every thread has passed the
 * barrier that follows that use. */
static void optimised_iterations(int index, long first, long last)
{
	const int32_t *xs = px, *ys = py;
	int8_t *member = membership;
	struct partial **sets[2] = { partials[0], partials[1] };
	int k = clusters, nthreads = threads;
	int64_t cx[MAX_CLUSTERS], cy[MAX_CLUSTERS];
	memcpy(cx, centre_x, sizeof(cx));
	memcpy(cy, centre_y, sizeof(cy));
	long moved = 0;
	for (int it = 0; it < iterations; it++) {
		struct partial local;
		memset(&local, 0, sizeof(local));
		for (long i = first; i < last; i++) {
			int c = nearest(cx, cy, k, xs[i], ys[i]);
			if (c != member[i]) {
				member[i] = (int8_t)c;
				local.changed++;
			}
			local.sum_x[c] += xs[i];
			local.sum_y[c] += ys[i];
			local.count[c]++;
		}
		struct partial **set = sets[it % 2];
		*set[index] = local;
		pthread_barrier_wait(&barrier);
		moved += combine(set, nthreads, k, cx, cy);
	}
	if (index == 0) {
		memcpy(centre_x, cx, sizeof(cx));
		memcpy(centre_y, cy, sizeof(cy));
		moves_total = moved;
	}
}

static void *worker(void *arg)
{
	int index = (int)(long)arg;
	dex_migrate(index % dex_nodes()); /* DEX port: go to this thread's node */
	long first = npoints * index / threads, last = npoints * (index + 1) / threads;
	if (naive)
		naive_iterations(index, first, last);
	else
		optimised_iterations(index, first, last);
	dex_migrate(0); /* DEX port: back to the origin */
	return NULL;
}

int main(int argc, char **argv)
{
	int arg = app_naive_flag(argc, argv, &naive);
	threads = (int)app_number(argc, argv, arg, threads);
	npoints = app_number(argc, argv, arg + 1, npoints);
	clusters = (int)app_number(argc, argv, arg + 2, clusters);
	iterations = (int)app_number(argc, argv, arg + 3, iterations);
	if (threads < 1 || threads > 256 || clusters < 1 || clusters > MAX_CLUSTERS || npoints < clusters)
		return 2;

	px = malloc(sizeof(*px) * (size_t)npoints);
	py = malloc(sizeof(*py) * (size_t)npoints);
	membership = malloc(sizeof(*membership) * (size_t)npoints);
	for (long i = 0; i < npoints; i++) {
		/* points scattered around `clusters` hidden centres */
		uint64_t r = app_mix((uint64_t)i);
		int hidden = (int)(r % (uint64_t)clusters);
		px[i] = (int32_t)(hidden * 10000 + (int)((r >> 16) % 4000) - 2000);
		py[i] = (int32_t)((hidden * 7919) % 50000 + (int)((r >> 32) % 4000) - 2000);
		membership[i] = -1;
	}
	for (int c = 0; c < clusters; c++) {
		centre_x[c] = px[c];
		centre_y[c] = py[c];
	}
	if (naive) {
		naive_partials = calloc((size_t)threads, sizeof(*naive_partials));
		naive_partial_of = malloc(sizeof(*naive_partial_of) * (size_t)threads);
		for (int t = 0; t < threads; t++)
			naive_partial_of[t] = &naive_partials[t];
	} else {
		for (int set = 0; set < 2; set++) {
			partials[set] = malloc(sizeof(*partials[set]) * (size_t)threads);
			for (int t = 0; t < threads; t++)
				partials[set][t] = dex_malloc_aligned(sizeof(struct partial));
		}
	}
	pthread_barrier_init(&barrier, NULL, (unsigned)threads);
	pthread_t *tids = malloc(sizeof(*tids) * (size_t)threads);
	for (int t = 0; t < threads; t++)
		pthread_create(&tids[t], NULL, worker, (void *)(long)t);
	for (int t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);

	uint64_t checksum = 0;
	for (long i = 0; i < npoints; i++)
		checksum = checksum * 31 + (uint64_t)membership[i];
	printf("KMN points=%ld clusters=%d iterations=%d centres:", npoints, clusters, iterations);
	for (int c = 0; c < clusters; c++)
		printf(" (%lld,%lld)", (long long)centre_x[c], (long long)centre_y[c]);
	printf(" membership=%016llx\n", (unsigned long long)checksum);
	(void)moves_total;
	(void)changed_flag;
	return 0;
}
