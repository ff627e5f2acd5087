/*
 * lwk_host_attacher: an LWK job (static musl, the LWK's /dev/xpmem) that attaches a host
 * process's named segment (host_named_owner): lookup through clowderd's name server, get, and
 * attach, which the daemon serves by adding the host owner's memory to the enclave as new
 * guest-physical regions. It checks the owner's pattern (page i starts with 2000 + i), detaches,
 * attaches again (the regions of the first attachment are gone by then), writes 43 into word 1
 * of page 0 for the owner to see, and detaches. The argument errors are checked on the way.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <xpmem.h>
#include "named_segment.h"

#define PAGE 4096UL
#define PAGES 16

static int pattern_pages(volatile uint64_t *view)
{
	int matching = 0;
	for (unsigned long page = 0; page < PAGES; page++)
		matching += view[page * PAGE / 8] == 2000 + page;
	return matching;
}

int main(void)
{
	xpmem_segid_t segid = wait_for_named_segment("host-owner-seg", 200);
	if (segid <= 0)
		return 1;
	printf("found a segment of enclave %lld\n", (long long)(segid >> 32));
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0) {
		printf("get failed: errno %d\n", errno);
		return 2;
	}
	struct xpmem_addr misaligned = { .apid = apid, .offset = 100 };
	int misaligned_refused = xpmem_attach(misaligned, PAGE, NULL) == (void *)-1 && errno == EINVAL;
	struct xpmem_addr beyond = { .apid = apid, .offset = PAGES * PAGE };
	int beyond_refused = xpmem_attach(beyond, PAGE, NULL) == (void *)-1 && errno == EINVAL;
	printf("misaligned attach refused: %d, attach beyond the segment refused: %d\n", misaligned_refused, beyond_refused);

	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	volatile uint64_t *view = xpmem_attach(address, PAGES * PAGE, NULL);
	if (view == (void *)-1) {
		printf("attach failed: errno %d\n", errno);
		return 3;
	}
	printf("%d of %d pages hold what the host wrote\n", pattern_pages(view), PAGES);
	printf("detach: %d\n", xpmem_detach((void *)view));

	/* Again, after the regions of the first attachment went; the reply goes through this one
	 * (the owner removes the segment once it sees it). */
	volatile uint64_t *again = xpmem_attach(address, PAGES * PAGE, NULL);
	if (again == (void *)-1) {
		printf("second attach failed: errno %d\n", errno);
		return 4;
	}
	printf("second attach: %d of %d pages\n", pattern_pages(again), PAGES);
	again[1] = 43;
	printf("detach: %d\n", xpmem_detach((void *)again));
	/* The owner removes the segment once it sees the 43, which takes the permit with it:
	 * a release after that finds nothing (ENOENT), as with XPMEM. */
	int released = xpmem_release(apid);
	printf("release: %s\n", released == 0 ? "0" : errno == ENOENT ? "ENOENT" : "failed");
	return 0;
}
