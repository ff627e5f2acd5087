/* KMN: k-means clustering of 2-D integer points, ported to DEX.
 * Threads own contiguous chunks of points, assign each to the nearest
 * centre and accumulate per-cluster sums; thread 0 combines the partial sums
 * into new centres between two barriers. Integer arithmetic keeps the result
 * identical for any number of threads and nodes.
 *
 * usage: kmeans [--naive] [threads] [points] [clusters] [iterations]
 *   default (optimised): per-thread partial sums on their own pages, staged
 *     in a local array; a per-thread "changed" count.
 *   --naive: the first port: partial sums of all threads side by side in one
 *     array, updated per point, and one global "changed" flag written by
 *     every thread whenever a point moves. */
#include <dex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CLUSTERS 64

struct partial {
	int64_t sum_x[MAX_CLUSTERS], sum_y[MAX_CLUSTERS], count[MAX_CLUSTERS];
	int64_t changed;
};

static int threads = 4, clusters = 8, iterations = 10;
static long npoints = 200000;
static int naive;
static int32_t *px, *py, *membership;
static int64_t centre_x[MAX_CLUSTERS], centre_y[MAX_CLUSTERS];
static struct partial **partials;
static struct partial *naive_partials;
static long changed_flag; /* naive: shared across threads */
static long moves_total;
static pthread_barrier_t barrier;

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int nearest(int32_t x, int32_t y)
{
	int best = 0;
	int64_t best_d = INT64_MAX;
	for (int c = 0; c < clusters; c++) {
		int64_t dx = x - centre_x[c], dy = y - centre_y[c];
		int64_t d = dx * dx + dy * dy;
		if (d < best_d) {
			best_d = d;
			best = c;
		}
	}
	return best;
}

static void *worker(void *arg)
{
	int index = (int)(long)arg;
	dex_migrate(index % dex_nodes()); /* DEX port: go to this thread's node */
	long first = npoints * index / threads, last = npoints * (index + 1) / threads;
	struct partial *mine = naive ? &naive_partials[index] : partials[index];
	struct partial local;
	for (int it = 0; it < iterations; it++) {
		struct partial *acc = naive ? mine : &local;
		memset(acc, 0, sizeof(*acc));
		for (long i = first; i < last; i++) {
			int c = nearest(px[i], py[i]);
			if (c != membership[i]) {
				membership[i] = c;
				if (naive)
					changed_flag++;
				else
					acc->changed++;
			}
			acc->sum_x[c] += px[i];
			acc->sum_y[c] += py[i];
			acc->count[c]++;
		}
		if (!naive)
			*mine = local;
		pthread_barrier_wait(&barrier);
		if (index == 0) {
			for (int c = 0; c < clusters; c++) {
				int64_t sx = 0, sy = 0, n = 0;
				for (int t = 0; t < threads; t++) {
					struct partial *p = naive ? &naive_partials[t] : partials[t];
					sx += p->sum_x[c];
					sy += p->sum_y[c];
					n += p->count[c];
				}
				if (n) {
					centre_x[c] = sx / n;
					centre_y[c] = sy / n;
				}
			}
			for (int t = 0; t < threads && !naive; t++)
				moves_total += partials[t]->changed;
		}
		pthread_barrier_wait(&barrier);
	}
	dex_migrate(0); /* DEX port: back to the origin */
	return NULL;
}

int main(int argc, char **argv)
{
	int arg = 1;
	if (argc > 1 && !strcmp(argv[1], "--naive")) {
		naive = 1;
		arg++;
	}
	if (argc > arg) threads = atoi(argv[arg]);
	if (argc > arg + 1) npoints = atol(argv[arg + 1]);
	if (argc > arg + 2) clusters = atoi(argv[arg + 2]);
	if (argc > arg + 3) iterations = atoi(argv[arg + 3]);
	if (threads < 1 || threads > 256 || clusters < 1 || clusters > MAX_CLUSTERS || npoints < clusters)
		return 2;

	px = malloc(sizeof(*px) * (size_t)npoints);
	py = malloc(sizeof(*py) * (size_t)npoints);
	membership = malloc(sizeof(*membership) * (size_t)npoints);
	for (long i = 0; i < npoints; i++) {
		/* points scattered around `clusters` hidden centres */
		uint64_t r = mix((uint64_t)i);
		int hidden = (int)(r % (uint64_t)clusters);
		px[i] = (int32_t)(hidden * 10000 + (int)((r >> 16) % 4000) - 2000);
		py[i] = (int32_t)((hidden * 7919) % 50000 + (int)((r >> 32) % 4000) - 2000);
		membership[i] = -1;
	}
	for (int c = 0; c < clusters; c++) {
		centre_x[c] = px[c];
		centre_y[c] = py[c];
	}
	partials = malloc(sizeof(*partials) * (size_t)threads);
	if (naive)
		naive_partials = calloc((size_t)threads, sizeof(*naive_partials));
	else
		for (int t = 0; t < threads; t++)
			partials[t] = dex_malloc_aligned(sizeof(struct partial));
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
