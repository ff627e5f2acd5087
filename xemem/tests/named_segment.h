/* Waiting for a named segment, for the test programs that attach one (host processes, LWK
   jobs, and clowderd's test support): its owner may not have made it yet. */
#ifndef NAMED_SEGMENT_H
#define NAMED_SEGMENT_H

#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <xpmem.h>

/* Looks `name` up every 50 ms, at most `tries` times: its segid, or -1 after printing
   "no segment named NAME (errno N)". */
static xpmem_segid_t wait_for_named_segment(const char *name, int tries)
{
	xpmem_segid_t segid = -1;
	for (int attempt = 0; attempt < tries && segid <= 0; attempt++) {
		segid = xemem_lookup_segid(name);
		if (segid <= 0)
			usleep(50000);
	}
	if (segid <= 0) {
		printf("no segment named %s (errno %d)\n", name, errno);
		return -1;
	}
	return segid;
}

#endif
