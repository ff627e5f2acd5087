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
#include "attach_segment.h"
#include "named_segment.h"

#define PAGE 4096UL
#define PAGES 16

int main(void)
{
	xpmem_segid_t segid = wait_for_named_segment("host-owner-seg", 200);
	if (segid <= 0)
		return 1;
	printf("found a segment of enclave %lld\n", (long long)(segid >> 32));
	xpmem_apid_t apid = get_segment(segid);
	if (apid <= 0)
		return GET_FAILED;
	struct xpmem_addr misaligned = { .apid = apid, .offset = 100 };
	int misaligned_refused = xpmem_attach(misaligned, PAGE, NULL) == (void *)-1 && errno == EINVAL;
	struct xpmem_addr beyond = { .apid = apid, .offset = PAGES * PAGE };
	int beyond_refused = xpmem_attach(beyond, PAGE, NULL) == (void *)-1 && errno == EINVAL;
	printf("misaligned attach refused: %d, attach beyond the segment refused: %d\n", misaligned_refused, beyond_refused);

	volatile uint64_t *view = attach_segment(apid, PAGES * PAGE);
	if (!view)
		return ATTACH_FAILED;
	printf("%d of %d pages hold what the host wrote\n", pages_with_pattern(view, PAGES, 2000), PAGES);
	printf("detach: %d\n", xpmem_detach((void *)view));

	/* Again, after the regions of the first attachment went; the reply goes through this one
	 * (the owner removes the segment once it sees it). */
	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	volatile uint64_t *again = xpmem_attach(address, PAGES * PAGE, NULL);
	if (again == (void *)-1) {
		printf("second attach failed: errno %d\n", errno);
		return 4;
	}
	printf("second attach: %d of %d pages\n", pages_with_pattern(again, PAGES, 2000), PAGES);
	again[1] = 43;
	printf("detach: %d\n", xpmem_detach((void *)again));
	/* The owner removes the segment once it sees the 43, which takes the permit with it:
	 * a release after that finds nothing (ENOENT), as with XPMEM. */
	int released = xpmem_release(apid);
	printf("release: %s\n", released == 0 ? "0" : errno == ENOENT ? "ENOENT" : "failed");
	return 0;
}
