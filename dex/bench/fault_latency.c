/* Remote page fault latency.
 *   read:  a thread on node 1 reads one word of each of many 4 KiB pages
 *          the origin owns (each access fetches the page: request + 4 KiB);
 *          in descending order, so that readahead (which follows ascending
 *          runs) does not fetch them ahead
 *   write: the same with a store (exclusive ownership + data, origin drops)
 *   sequential read: consecutive pages, per page (readahead at work)
 *   contended: two threads on two nodes increment one word alternately,
 *          so every step moves the page (DEX's contention microbenchmark);
 *          reported per page transfer.
 * usage: fault_latency [pages] [pingpong rounds] */
#include <dex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "samples.h"

static volatile long turn;
static long rounds;

static void *pingpong(void *arg)
{
	long me = (long)arg;
	if (me)
		dex_migrate(1);
	for (long i = 0; i < rounds; i++) {
		/* yield while waiting: on a machine with fewer cores than
		 * spinning threads plus runtime threads, a pure spin would starve
		 * the receiver that must deliver the page */
		while (turn % 2 != me)
			sched_yield();
		turn++;
	}
	if (me)
		dex_migrate(0);
	return NULL;
}

int main(int argc, char **argv)
{
	int pages = argc > 1 ? atoi(argv[1]) : 2000;
	rounds = argc > 2 ? atol(argv[2]) : 5000;
	if (pages < 1 || rounds < 1) {
		fprintf(stderr, "usage: fault_latency [pages >= 1] [pingpong rounds >= 1]\n");
		return 2;
	}
	if (dex_nodes() < 2) {
		fprintf(stderr, "run with dexrun -n 2\n");
		return 2;
	}
	/* pages [0, n): reads, [n, 2n): writes (both descending), [2n, 3n): ascending reads */
	char *area = dex_malloc_aligned((size_t)pages * 3 * 4096);
	for (long i = 0; i < (long)pages * 3 * 4096; i += 4096)
		area[i] = (char)i; /* origin owns every page, written */
	uint64_t *read_ns = malloc(sizeof(uint64_t) * (size_t)pages);
	uint64_t *write_ns = malloc(sizeof(uint64_t) * (size_t)pages);
	dex_migrate(1);
	/* per-access times are kept in registers/local pages that are already
	 * here, so only the measured page faults */
	uint64_t local_read[4096], local_write[4096];
	int n = pages > 4096 ? 4096 : pages;
	long sink = 0;
	for (int i = 0; i < n; i++) {
		volatile char *p = area + (size_t)(pages - 1 - i) * 4096;
		uint64_t t0 = now_ns();
		sink += *p;
		local_read[i] = now_ns() - t0;
	}
	for (int i = 0; i < n; i++) {
		volatile char *p = area + (size_t)(2 * pages - 1 - i) * 4096;
		uint64_t t0 = now_ns();
		*p = 1;
		local_write[i] = now_ns() - t0;
	}
	uint64_t sequential_start = now_ns();
	for (int i = 0; i < pages; i++)
		sink += *(volatile char *)(area + (size_t)(2 * pages + i) * 4096);
	double sequential = (now_ns() - sequential_start) / 1000.0 / pages;
	dex_migrate(0);
	for (int i = 0; i < n; i++) {
		read_ns[i] = local_read[i];
		write_ns[i] = local_write[i];
	}
	pthread_t a, b;
	uint64_t t0 = now_ns();
	pthread_create(&a, NULL, pingpong, (void *)0);
	pthread_create(&b, NULL, pingpong, (void *)1);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	double contended = (now_ns() - t0) / 1000.0 / (2.0 * rounds);
	printf("read_fault_median_us %.1f\n", median_us(read_ns, n));
	printf("read_fault_p90_us %.1f\n", percentile_us(read_ns, n, 0.9));
	printf("write_fault_median_us %.1f\n", median_us(write_ns, n));
	printf("contended_transfer_mean_us %.1f\n", contended);
	printf("sequential_read_per_page_us %.2f\n", sequential);
	printf("(sink %ld)\n", sink);
	return 0;
}
