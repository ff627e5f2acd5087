/*
 * host_named_owner: a host process that exports PAGES pages of private memory as the named
 * segment "host-owner-seg" (libxpmem -> clowderd's broker), page i starting with 2000 + i, and
 * waits for an LWK job (lwk_host_attacher) to write 43 into word 1 of page 0 through its
 * attachment, then removes the segment. node/clowderd/tests/xemem_lwk.rs drives both.
 * Usage: host_named_owner [PAGES] (default 16).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <xpmem.h>
#include "patterned_segment.h"

int main(int argc, char **argv)
{
	unsigned long pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 16;
	xpmem_segid_t segid;
	volatile uint64_t *buffer = make_patterned_segment(pages, 2000, "host-owner-seg", &segid);
	if (!buffer)
		return 1;
	if (segid <= 0) {
		printf("make failed: errno %d\n", errno);
		return 2;
	}
	printf("made host-owner-seg\n");
	fflush(stdout);
	/* Up to 60 s: the LWK job is built and started after this line appears. */
	if (!wait_for_word(&buffer[1], 43, 6000)) {
		printf("the LWK job never wrote\n");
		return 3;
	}
	printf("the LWK wrote 43\n");
	printf("remove: %d\n", xpmem_remove(segid));
	return 0;
}
