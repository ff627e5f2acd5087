/*
 * lwk_snapshot: XEMEM snapshots (TCASM) through xpmem.h, one static binary on the host
 * (libxpmem over a broker: memfd and MAP_PRIVATE) and in the lightweight kernel (its
 * /dev/xpmem: page-table copy-on-write). xemem/lwk-test.sh runs it in both places.
 *   1. bad input: a snapshot of memory that is not a region (inside one, or malloc's) is
 *      EINVAL, a release of a segid that is no snapshot ENOENT;
 *   2. a region of 2 MiB and 8 pages (a 2 MiB page and a partial one) is filled (page i holds
 *      i), snapshotted and attached as any segment; a second snapshot and an xpmem_make over
 *      it are EBUSY while it is out;
 *   3. the writer rewrites every third page and the last: the attachment still reads every
 *      page's old value, the writer its new ones;
 *   4. release: a second release is ENOENT, a get of the segid fails; the next snapshot shows
 *      the rewritten data; the region exported live (xpmem_make) between snapshots shows the
 *      writer's stores, refuses a snapshot (EBUSY) until removed, and the snapshot after holds
 *      them; freeing the region twice is EINVAL the second time;
 *   5. in the LWK: the enclave's free memory (sysinfo) drops by the region's size and by a
 *      page per page written, and is back once the region is freed (but for a few page
 *      tables, which the kernel gives back between jobs);
 *   6. a forked child that ends with a region and its snapshot out leaves nothing behind (in
 *      the LWK: the enclave's free memory is back).
 * Prints one line per check; exits 0 when everything held.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xpmem.h>

#include "check_line.h"

#define PAGE 4096UL
#define PAGES (512 + 8)
#define SIZE (PAGES * PAGE)
#define REWRITTEN(i) ((i) % 3 == 0 || (i) == PAGES - 1)
#define WRITTEN ((PAGES + 2) / 3 + 1)
/* What the kernel may keep of the enclave's memory besides: page tables (retired ones go back
 * between jobs) and its own bookkeeping. */
#define KERNEL_SLACK (32 * (long)PAGE)


/* The kernel's free memory in the LWK (sysinfo's freeram); -1 on the host, whose free memory
 * moves with everything else running. */
static long lwk_free_memory(void)
{
	struct sysinfo info;
	int device = open(XPMEM_DEV_PATH, O_RDWR);
	if (device < 0)
		return -1;
	close(device);
	if (sysinfo(&info) != 0)
		return -1;
	return (long)(info.freeram * info.mem_unit);
}

/* Whether page i of `memory` reads as `base` + i (rewritten pages: `rewritten` + i). */
static int pages_hold(volatile uint64_t *memory, uint64_t base, uint64_t rewritten)
{
	for (unsigned long i = 0; i < PAGES; i++)
		if (memory[i * PAGE / 8] != (REWRITTEN(i) ? rewritten : base) + i)
			return 0;
	return 1;
}

int main(void)
{
	long free_before = lwk_free_memory();
	uint64_t *region = xemem_region_alloc(SIZE);
	check(region != (void *)-1, "xemem_region_alloc of 2 MiB and 8 pages");
	if (region == (void *)-1)
		return 1;
	long free_allocated = lwk_free_memory();
	if (free_before >= 0)
		check(free_allocated <= free_before - (long)SIZE, "lwk: the region takes the enclave's memory");
	for (unsigned long i = 0; i < PAGES; i++)
		region[i * PAGE / 8] = i;

	errno = 0;
	check(xemem_snapshot_make((char *)region + PAGE, XPMEM_PERMIT_MODE, (void *)0600, NULL) == -1 && errno == EINVAL,
	      "a snapshot inside a region: EINVAL");
	void *heap = malloc(SIZE);
	errno = 0;
	check(xemem_snapshot_make(heap, XPMEM_PERMIT_MODE, (void *)0600, NULL) == -1 && errno == EINVAL,
	      "a snapshot of memory that is not a region: EINVAL");
	free(heap);
	errno = 0;
	check(xemem_snapshot_release(0x12345) == -1 && errno == ENOENT, "a release of no snapshot: ENOENT");

	xpmem_segid_t segid = xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	check(segid > 0, "xemem_snapshot_make");
	errno = 0;
	check(xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL) == -1 && errno == EBUSY,
	      "a second snapshot while one is out: EBUSY");
	errno = 0;
	check(xpmem_make(region, SIZE, XPMEM_PERMIT_MODE, (void *)0600) == -1 && errno == EBUSY,
	      "xpmem_make over the region while a snapshot is out: EBUSY");
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	volatile uint64_t *view = apid > 0 ? xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, SIZE, NULL)
					   : (void *)-1;
	check(view != (void *)-1, "the snapshot attaches as a segment");
	if (view == (void *)-1)
		return 1;
	check(pages_hold(view, 0, 0), "the attachment reads the snapshot");

	for (unsigned long i = 0; i < PAGES; i++)
		if (REWRITTEN(i))
			region[i * PAGE / 8] = 1000000 + i;
	check(pages_hold(region, 0, 1000000), "the writer reads what it rewrote");
	check(pages_hold(view, 0, 0), "the attachment still reads the snapshot (copy-on-write)");
	long free_written = lwk_free_memory();
	if (free_before >= 0)
		check(free_allocated - free_written >= (long)(WRITTEN * PAGE) &&
			      free_allocated - free_written <= (long)(WRITTEN * PAGE) + KERNEL_SLACK,
		      "lwk: the copies take a page per page written");

	check(xpmem_detach((void *)view) == 0 && xpmem_release(apid) == 0, "detach and release the attachment");
	check(xemem_snapshot_release(segid) == 0, "xemem_snapshot_release");
	errno = 0;
	check(xemem_snapshot_release(segid) == -1 && errno == ENOENT, "a second release: ENOENT");
	check(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) == -1, "a get of the released snapshot fails");

	segid = xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	apid = segid > 0 ? xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) : -1;
	view = apid > 0 ? xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, SIZE, NULL) : (void *)-1;
	check(view != (void *)-1 && pages_hold(view, 0, 1000000), "the next snapshot shows the rewritten pages");
	region[0] = 7;
	check(view != (void *)-1 && view[0] == 1000000 && region[0] == 7, "a store after it is the writer's alone");
	if (view != (void *)-1)
		xpmem_detach((void *)view);
	xpmem_release(apid);
	check(xemem_snapshot_release(segid) == 0, "the second snapshot releases");

	/* Exported live between snapshots: attachers see the writer's stores, and no snapshot is
	 * taken while the segment exists. */
	xpmem_segid_t live = xpmem_make(region, SIZE, XPMEM_PERMIT_MODE, (void *)0600);
	apid = live > 0 ? xpmem_get(live, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) : -1;
	view = apid > 0 ? xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, SIZE, NULL) : (void *)-1;
	region[5 * PAGE / 8] = 4242;
	region[6 * PAGE / 8] = 4343;
	check(view != (void *)-1 && view[5 * PAGE / 8] == 4242 && view[6 * PAGE / 8] == 4343,
	      "the region exported live between snapshots shows the writer's stores");
	errno = 0;
	check(xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL) == -1 && errno == EBUSY,
	      "no snapshot of a region that is exported: EBUSY");
	if (view != (void *)-1)
		xpmem_detach((void *)view);
	xpmem_release(apid);
	check(live > 0 && xpmem_remove(live) == 0, "the live segment goes");
	segid = xemem_snapshot_make(region, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	apid = segid > 0 ? xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) : -1;
	view = apid > 0 ? xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, SIZE, NULL) : (void *)-1;
	region[5 * PAGE / 8] = 1;
	check(view != (void *)-1 && view[5 * PAGE / 8] == 4242 && view[6 * PAGE / 8] == 4343 && region[5 * PAGE / 8] == 1,
	      "a snapshot after it holds the live stores, and not the later ones");
	if (view != (void *)-1)
		xpmem_detach((void *)view);
	xpmem_release(apid);
	check(xemem_snapshot_release(segid) == 0, "that snapshot releases");

	check(xemem_region_free(region) == 0, "xemem_region_free");
	errno = 0;
	check(xemem_region_free(region) == -1 && errno == EINVAL, "a second free: EINVAL");
	if (free_before >= 0)
		check(lwk_free_memory() >= free_before - KERNEL_SLACK,
		      "lwk: the region's memory and its copies are back (but for page tables the job keeps)");
	/* A process that ends with a region and its snapshot out: both go with it. */
	long free_before_child = lwk_free_memory();
	pid_t child = fork();
	if (child == 0) {
		uint64_t *own = xemem_region_alloc(SIZE);
		if (own == (void *)-1)
			_exit(1);
		own[0] = 1;
		_exit(xemem_snapshot_make(own, XPMEM_PERMIT_MODE, (void *)0600, NULL) > 0 && (own[0] = 2) == 2 ? 0 : 1);
	}
	int status = -1;
	check(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "a child ends with a region and its snapshot out");
	if (free_before >= 0)
		check(lwk_free_memory() >= free_before_child - KERNEL_SLACK, "lwk: the child's region and copies are back");
	printf(failures ? "lwk_snapshot: %d failed\n" : "lwk_snapshot: all passed\n", failures);
	return failures ? 1 : 0;
}
