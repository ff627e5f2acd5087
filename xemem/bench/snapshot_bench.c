/*
 * snapshot_bench: what a copy-on-write snapshot (xemem_snapshot_make/_release) costs a writer,
 * against copying the region. A region of SIZE MiB is filled once (every page mapped); then,
 * in each of REPS cycles, the writer takes a snapshot, rewrites WRITTEN pages under it (spread
 * evenly, each wholly) and releases it; the next cycle's snapshot folds them. PATTERN `same`
 * rewrites the same pages at every cycle; `moving` alternates between two sets of pages (the
 * second one page after the first), so every page a cycle writes was left alone by the one
 * before. Medians of:
 *   copy     memcpy of the whole region into memory already mapped (what a snapshot saves)
 *   make     xemem_snapshot_make: the pages written since the last snapshot found (a walk of
 *            the view's page table) and copied into the region's memfd
 *   cow      the rewrite under the snapshot less the same rewrite once more (the pages then the
 *            writer's own): the fault on each page's first store since the snapshot
 *   release  xemem_snapshot_release (the segment removed)
 * and, outside the snapshot's own cost:
 *   first    the region's first make, which maps the view MAP_PRIVATE (every page was mapped)
 *   refill   a pass reading one word of every page after a cycle, less the same pass again:
 *            what a writer that reads its whole region pays for the pages a cycle unmapped
 * CLOCK is wall (elapsed time) or cpu (the thread's CPU time, user and system: on a loaded
 * machine, without the time other processes ran; the broker's own work, two requests a cycle,
 * is not in it). Prints one Markdown table row: size, written, copy, make, cow, release,
 * snapshot total (make + cow + release) and its share of the copy, first, refill and its share.
 * Usage: snapshot_bench SIZE_MIB WRITTEN_PAGES REPS wall|cpu [same|moving]; needs a broker
 * (CLOWDER_XEMEM_SOCKET).
 */
#include <sys/mman.h>

#include "bench_common.h"

static const char *program = "snapshot_bench";
static clockid_t clock_used = CLOCK_MONOTONIC;

static double now_on_clock(void)
{
	struct timespec ts;
	clock_gettime(clock_used, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}
#define now now_on_clock

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *samples, int n)
{
	qsort(samples, n, sizeof *samples, by_value);
	return samples[n / 2];
}

/* Rewrites `written` pages spread evenly over `pages`, from page `shift` on, each wholly, with
 * `value`. */
static double rewrite(char *region, size_t pages, size_t written, size_t shift, int value)
{
	size_t stride = pages / written;
	double start = now();
	for (size_t i = 0; i < written; i++)
		memset(region + (i * stride + shift) * PAGE, value, PAGE);
	return now() - start;
}

/* Reads one word of every page. */
static double touch_all(const char *region, size_t pages)
{
	volatile uint64_t sum = 0;
	double start = now();
	for (size_t i = 0; i < pages; i++)
		sum += *(const volatile uint64_t *)(region + i * PAGE);
	(void)sum;
	return now() - start;
}

int main(int argc, char **argv)
{
	if (argc != 5 && argc != 6) {
		fprintf(stderr, "usage: %s SIZE_MIB WRITTEN_PAGES REPS wall|cpu [same|moving]\n", program);
		return 2;
	}
	int moving = argc == 6 && !strcmp(argv[5], "moving");
	size_t size = strtoull(argv[1], NULL, 0) << 20;
	size_t written = strtoull(argv[2], NULL, 0);
	int reps = atoi(argv[3]);
	size_t pages = size / PAGE;
	if (size == 0 || written == 0 || written > pages || reps < 1 || reps > 100 ||
	    (strcmp(argv[4], "wall") && strcmp(argv[4], "cpu")) || (argc == 6 && !moving && strcmp(argv[5], "same")) ||
	    (moving && written > pages / 2)) {
		fprintf(stderr, "%s: SIZE_MIB from 1, WRITTEN_PAGES from 1 to the region's pages (half of them if moving), "
				"REPS 1..100, CLOCK wall or cpu, PATTERN same or moving\n", program);
		return 2;
	}
	if (!strcmp(argv[4], "cpu"))
		clock_used = CLOCK_THREAD_CPUTIME_ID;
	char *region = xemem_region_alloc(size);
	if (region == (void *)-1)
		die(program, "xemem_region_alloc");
	memset(region, 1, size);
	char *copy = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (copy == MAP_FAILED)
		die(program, "mmap the copy's destination");

	double copy_s[100], make_s[100], cow_s[100], release_s[100], refill_s[100];
	double start = now();
	xpmem_segid_t segid = xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	double first = now() - start;
	if (segid <= 0 || xemem_snapshot_release(segid) < 0)
		die(program, "the first snapshot");
	for (int r = 0; r < reps; r++) {
		start = now();
		memcpy(copy, region, size);
		copy_s[r] = now() - start;
	}
	for (int r = 0; r < reps; r++) {
		start = now();
		segid = xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL);
		make_s[r] = now() - start;
		if (segid <= 0)
			die(program, "xemem_snapshot_make");
		/* The pages' first stores since the snapshot fault; the same stores again, the pages
		 * now the writer's own, are the baseline: what the rewrite costs without snapshots. */
		size_t shift = moving ? (size_t)r % 2 : 0;
		double first_stores = rewrite(region, pages, written, shift, 1 + r);
		cow_s[r] = first_stores - rewrite(region, pages, written, shift, 2 + r);
		start = now();
		if (xemem_snapshot_release(segid) < 0)
			die(program, "xemem_snapshot_release");
		release_s[r] = now() - start;
	}
	/* The refill, after the cycles. */
	for (int r = 0; r < reps; r++) {
		segid = xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL);
		if (segid <= 0 || xemem_snapshot_release(segid) < 0)
			die(program, "a snapshot cycle");
		double refilling = touch_all(region, pages);
		refill_s[r] = refilling - touch_all(region, pages);
	}
	double copy_m = median(copy_s, reps), make_m = median(make_s, reps), cow_m = median(cow_s, reps);
	double release_m = median(release_s, reps), refill_m = median(refill_s, reps);
	double total = make_m + cow_m + release_m;
	printf("| %zu MiB | %zu (%.2f%%)%s | %.1f | %.3f | %.3f | %.3f | %.3f (%.2f%%) | %.1f | %.1f (%.0f%%) |\n", size >> 20,
	       written, 100.0 * written / pages, moving ? ", moving" : "", copy_m * 1e3, make_m * 1e3, cow_m * 1e3, release_m * 1e3, total * 1e3,
	       100 * total / copy_m, first * 1e3, refill_m * 1e3, 100 * refill_m / copy_m);
	xemem_region_free(region);
	munmap(copy, size);
	return 0;
}
