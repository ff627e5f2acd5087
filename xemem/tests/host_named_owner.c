/*
 * host_named_owner: a host process that exports PAGES pages of private memory as the named
 * segment "host-owner-seg" (libxpmem -> clowderd's broker), page i starting with 2000 + i, and
 * waits for an LWK job (lwk_host_attacher) to write 43 into word 1 of page 0 through its
 * attachment, then removes the segment. node/clowderd/tests/xemem_lwk.rs drives both.
 * Usage: host_named_owner [PAGES] (default 16).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <xpmem.h>
#include "patterned_segment.h"

int main(int argc, char **argv)
{
	unsigned long pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 16;
	xpmem_segid_t segid;
	volatile uint64_t *buffer = export_patterned_segment(pages, 2000, "host-owner-seg", "make", &segid);
	if (!buffer)
		return 2;
	/* Up to 60 s: the LWK job is built and started after this line appears. */
	if (!report_write(wait_for_word(&buffer[1], 43, 6000), "the LWK", 43))
		return 3;
	printf("remove: %d\n", xpmem_remove(segid));
	return 0;
}
