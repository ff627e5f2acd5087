/* Migration latency between the origin and node 1, DEX Table II style.
 * Prints one line per kind: first forward (creates the remote worker),
 * later forward (pooled worker), backward. Times are taken before the call
 * on the source and after the return on the destination (CLOCK_MONOTONIC is
 * machine-wide, and all nodes run on this machine).
 * usage: migration_latency [repetitions] */
#include <dex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "samples.h"

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 200;
	if (reps < 1) {
		fprintf(stderr, "usage: migration_latency [repetitions >= 1]\n");
		return 2;
	}
	if (dex_nodes() < 2) {
		fprintf(stderr, "run with dexrun -n 2\n");
		return 2;
	}
	/* Written on node 1 and at the origin respectively: pages of their own,
	 * so that recording a sample does not move a page between nodes. */
	uint64_t *forward = dex_malloc_aligned(sizeof(uint64_t) * (size_t)reps);
	uint64_t *backward = dex_malloc_aligned(sizeof(uint64_t) * (size_t)reps);
	uint64_t t0 = now_ns();
	dex_migrate(1);
	uint64_t first_forward = now_ns() - t0;
	t0 = now_ns();
	dex_migrate(0);
	uint64_t first_backward = now_ns() - t0;
	for (int i = 0; i < reps; i++) {
		t0 = now_ns();
		dex_migrate(1);
		forward[i] = now_ns() - t0;
		t0 = now_ns();
		dex_migrate(0);
		backward[i] = now_ns() - t0;
	}
	printf("first_forward_us %.1f\n", first_forward / 1000.0);
	printf("first_backward_us %.1f\n", first_backward / 1000.0);
	printf("later_forward_us %.1f\n", median_us(forward, reps));
	printf("later_backward_us %.1f\n", median_us(backward, reps));
	return 0;
}
