/*
 * host_segid_attacher SEGID: a host process that attaches the segment SEGID (an LWK job's
 * anonymous segment, lwk_anonymous_owner, or a host_keeper's made with BASE 5000) with the
 * plain XPMEM API through clowderd's broker, checks its 16 pages (page i starts with 5000 + i)
 * and writes 45 into word 1 of page 0.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES 16

int main(int argc, char **argv)
{
	if (argc != 2)
		return 1;
	xpmem_segid_t segid = strtoll(argv[1], NULL, 0);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0) {
		printf("get failed: errno %d\n", errno);
		return 2;
	}
	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	volatile uint64_t *view = xpmem_attach(address, PAGES * PAGE, NULL);
	if (view == (void *)-1) {
		printf("attach failed: errno %d\n", errno);
		return 3;
	}
	int matching = 0;
	for (unsigned long page = 0; page < PAGES; page++)
		matching += view[page * PAGE / 8] == 5000 + page;
	printf("%d of %d pages hold what the job wrote\n", matching, PAGES);
	view[1] = 45;
	printf("detach: %d\n", xpmem_detach((void *)view));
	printf("release: %d\n", xpmem_release(apid));
	return matching == PAGES ? 0 : 4;
}
