/*
 * host_cycler NAME BASE: a host attacher that goes through a segment's whole life twice: finds
 * NAME, gets a permit, attaches the 16 pages, checks them (page i starts with BASE + i),
 * detaches, releases; then once more, and after the second release checks that the old permit
 * is refused (attach and release fail). Prints "get", "attach", "detach" and "release" results
 * and "cycled twice" when all went well (node/clowderd/tests/xemem_multihop.rs).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <xpmem.h>
#include "named_segment.h" /* xemem/tests */

#define PAGE 4096UL
#define PAGES 16

static int cycle(xpmem_segid_t segid, uint64_t base, xpmem_apid_t *used)
{
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	printf("get: %s (errno %d)\n", apid > 0 ? "ok" : "failed", apid > 0 ? 0 : errno);
	if (apid <= 0)
		return 1;
	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	volatile uint64_t *view = xpmem_attach(address, PAGES * PAGE, NULL);
	printf("attach: %s (errno %d)\n", view != (void *)-1 ? "ok" : "failed", view != (void *)-1 ? 0 : errno);
	if (view == (void *)-1)
		return 2;
	int matching = 0;
	for (unsigned long page = 0; page < PAGES; page++)
		matching += view[page * PAGE / 8] == base + page;
	printf("%d of %d pages\n", matching, PAGES);
	int detached = xpmem_detach((void *)view);
	printf("detach: %d\n", detached);
	int released = xpmem_release(apid);
	printf("release: %d (errno %d)\n", released, released ? errno : 0);
	fflush(stdout);
	*used = apid;
	return matching == PAGES && detached == 0 && released == 0 ? 0 : 3;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: host_cycler NAME BASE\n");
		return 64;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint64_t base = strtoull(argv[2], NULL, 0);
	xpmem_segid_t segid = wait_for_named_segment(argv[1], 400);
	if (segid <= 0)
		return 1;
	xpmem_apid_t first = 0, second = 0;
	if (cycle(segid, base, &first) || cycle(segid, base, &second))
		return 2;
	struct xpmem_addr stale = { .apid = second, .offset = 0 };
	int attach_refused = xpmem_attach(stale, PAGE, NULL) == (void *)-1;
	int release_refused = xpmem_release(second) == -1;
	printf("a released permit is refused: %s\n", attach_refused && release_refused ? "yes" : "no");
	if (!attach_refused || !release_refused)
		return 3;
	printf("cycled twice\n");
	return 0;
}
