/*
 * host_segid_attacher SEGID: a host process that attaches the segment SEGID (an LWK job's
 * anonymous segment, lwk_anonymous_owner, or a host_keeper's made with BASE 5000) with the
 * plain XPMEM API through clowderd's broker, checks its 16 pages (page i starts with 5000 + i)
 * and writes 45 into word 1 of page 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <xpmem.h>
#include "attach_segment.h"

#define PAGE 4096UL
#define PAGES 16

int main(int argc, char **argv)
{
	if (argc != 2)
		return 1;
	xpmem_segid_t segid = strtoll(argv[1], NULL, 0);
	xpmem_apid_t apid = get_segment(segid);
	if (apid <= 0)
		return GET_FAILED;
	int matching;
	volatile uint64_t *view = attach_and_check(apid, PAGES, 5000, "what the job wrote", &matching);
	if (!view)
		return ATTACH_FAILED;
	view[1] = 45;
	printf("detach: %d\n", xpmem_detach((void *)view));
	printf("release: %d\n", xpmem_release(apid));
	return matching == PAGES ? 0 : 4;
}
