/* GRP: string match (after Phoenix's string_match), ported to DEX.
 * Threads scan chunks of a generated text for a few keys and count the
 * occurrences of each.
 *
 * usage: grp [--naive] [threads] [text MiB]
 *   default (optimised): counts are staged in a local array and added to
 *     the totals once per thread.
 *   --naive: the first port: every match increments the shared global
 *     counter at once (an atomic add on one hot page). */
#include <dex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

static const char *const keys[] = { "dex", "page", "node", "fault", "moved" };
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static char *text;
static size_t text_len;
static int threads = 4, naive;
static long totals[NKEYS];

struct job {
	int index;
	size_t first, last;
};

static void *scan(void *arg)
{
	struct job *job = arg;
	dex_migrate(job->index % dex_nodes()); /* DEX port: go to this thread's node */
	long local[NKEYS] = { 0 };
	size_t lens[NKEYS];
	for (size_t k = 0; k < NKEYS; k++)
		lens[k] = strlen(keys[k]);
	for (size_t i = job->first; i < job->last; i++) {
		for (size_t k = 0; k < NKEYS; k++) {
			if (i + lens[k] <= text_len && text[i] == keys[k][0] && !memcmp(text + i, keys[k], lens[k])) {
				if (naive)
					__atomic_fetch_add(&totals[k], 1, __ATOMIC_RELAXED);
				else
					local[k]++;
			}
		}
	}
	if (!naive)
		for (size_t k = 0; k < NKEYS; k++)
			__atomic_fetch_add(&totals[k], local[k], __ATOMIC_RELAXED);
	dex_migrate(0); /* DEX port: back to the origin */
	return NULL;
}

int main(int argc, char **argv)
{
	int arg = app_naive_flag(argc, argv, &naive);
	threads = (int)app_number(argc, argv, arg, threads);
	long mib = app_number(argc, argv, arg + 1, 16);
	if (threads < 1 || threads > 256 || mib < 1 || mib > 4096)
		return 2;
	text_len = (size_t)mib << 20;
	text = malloc(text_len);
	/* letters from a small alphabet, with the keys sprinkled in */
	const char alphabet[] = "adefgmnoptuv ";
	for (size_t i = 0; i < text_len; i++)
		text[i] = alphabet[app_mix(i) % (sizeof(alphabet) - 1)];
	for (size_t i = 0; i + 8 < text_len; i += 997 + app_mix(i) % 1000)
		memcpy(text + i, keys[app_mix(i) % NKEYS], strlen(keys[app_mix(i) % NKEYS]));

	struct job *jobs = malloc(sizeof(*jobs) * (size_t)threads);
	pthread_t *tids = malloc(sizeof(*tids) * (size_t)threads);
	for (int t = 0; t < threads; t++) {
		jobs[t] = (struct job){ t, text_len * (size_t)t / (size_t)threads,
					text_len * (size_t)(t + 1) / (size_t)threads };
		pthread_create(&tids[t], NULL, scan, &jobs[t]);
	}
	for (int t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	printf("GRP text=%ldMiB", mib);
	for (size_t k = 0; k < NKEYS; k++)
		printf(" %s=%ld", keys[k], totals[k]);
	printf("\n");
	return 0;
}
