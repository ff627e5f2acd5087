/*
 * What the XEMEM benchmarks share: time, sorting samples, errors, and the rendezvous of a named
 * segment's owner with its attacher when they run in different enclaves (no socketpair
 * between them): the attacher finds the segment by name and, when it has finished, writes
 * DONE_MAGIC into the segment's last word; the owner polls that word, then removes the segment.
 * The programs build for the host (glibc, libxpmem through clowderd's broker) and as static
 * LWK jobs (musl, libxpmem through the LWK's /dev/xpmem).
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xpmem.h>

#define PAGE 4096UL
#define DONE_MAGIC 0x444f4e45444f4e45ULL /* "ENODENOD" */
/* How long an attacher waits for the owner's name. */
#define LOOKUP_WAIT_SECONDS 60

static inline double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void die(const char *program, const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", program, what, strerror(errno));
	exit(1);
}

static inline int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Sorts the samples; returns the element at quantile q (0.5: median). */
static inline double quantile(double *samples, int n, double q)
{
	qsort(samples, n, sizeof *samples, compare_doubles);
	int at = (int)(n * q);
	return samples[at < n ? at : n - 1];
}

/* TEXT as a whole number in 1..MAX; otherwise exits 2 after "PROGRAM: WHAT must be 1..MAX,
 * got TEXT". */
static inline long parse_whole(const char *program, const char *text, long max, const char *what)
{
	char *end;
	long value = strtol(text, &end, 10);
	if (*end || value <= 0 || value > max) {
		fprintf(stderr, "%s: %s must be 1..%ld, got %s\n", program, what, max, text);
		exit(2);
	}
	return value;
}

static inline void sleep_ms(long ms)
{
	struct timespec pause = { ms / 1000, (ms % 1000) * 1000000 };
	nanosleep(&pause, NULL);
}

/* The segid of NAME, waiting for its owner to make it; exits with an error if it never comes. */
static inline xpmem_segid_t find_named(const char *program, const char *name)
{
	double deadline = now() + LOOKUP_WAIT_SECONDS;
	for (;;) {
		xpmem_segid_t segid = xemem_lookup_segid(name);
		if (segid > 0)
			return segid;
		if (now() > deadline)
			die(program, "no segment of that name appeared (xemem_lookup_segid)");
		sleep_ms(50);
	}
}

/* Tells the owner of the segment behind APID (SIZE bytes) that the attacher has finished. */
static inline void signal_done(const char *program, xpmem_apid_t apid, size_t size)
{
	volatile uint64_t *view = xpmem_attach((struct xpmem_addr){ apid, 0 }, size, NULL);
	if (view == (void *)-1)
		die(program, "attach to signal the owner");
	view[size / 8 - 1] = DONE_MAGIC;
	xpmem_detach((void *)view);
}

/* The owner's side: polls the last word of its SIZE-byte segment at P for up to SECONDS. 0 when
 * the attacher signalled, -1 on timeout. */
static inline int wait_done(const void *p, size_t size, int seconds)
{
	volatile const uint64_t *last = (volatile const uint64_t *)p + size / 8 - 1;
	double deadline = now() + seconds;
	while (*last != DONE_MAGIC) {
		if (now() > deadline)
			return -1;
		sleep_ms(10);
	}
	return 0;
}

#endif
