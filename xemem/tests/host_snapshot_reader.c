/*
 * host_snapshot_reader: a host process that reads an LWK job's snapshot (lwk_snapshot_writer.c)
 * while the job rewrites the region under it. node/clowderd/tests/xemem_lwk_snapshot.rs
 * drives both. It attaches "lwk-snapshot", checks the 520 pages (page i starts with 5000 + i),
 * signals the job, waits for "lwk-snapshot-rewritten" (the job rewrote every page), checks
 * again (the same), signals again and waits for the snapshot's name to go (release): a get of
 * its segid then fails. Exits 0 when everything held.
 */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <xpmem.h>
#include "attach_segment.h"

#define PAGES (512 + 8)

int main(void)
{
	xpmem_apid_t apid;
	int failed = get_named_segment("lwk-snapshot", 400, &apid);
	if (failed)
		return failed;
	xpmem_segid_t segid = xemem_lookup_segid("lwk-snapshot");
	int before, after;
	volatile uint64_t *view = attach_and_check(apid, PAGES, 5000, "the snapshot", &before);
	if (!view)
		return ATTACH_FAILED;
	xemem_signal(apid);
	if (wait_for_named_segment("lwk-snapshot-rewritten", 400) <= 0)
		return 4;
	after = pages_with_pattern(view, PAGES, 5000);
	printf("%d of %d pages hold the snapshot while the job rewrote them\n", after, PAGES);
	fflush(stdout);
	xemem_signal(apid);
	int gone = 0;
	for (int i = 0; i < 400 && !gone; i++) {
		gone = xemem_lookup_segid("lwk-snapshot") == -1;
		if (!gone)
			usleep(50000);
	}
	xpmem_detach((void *)view);
	xpmem_release(apid);
	int refused = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) == -1;
	printf(gone && refused ? "the released snapshot is gone\n" : "the snapshot outlived its release\n");
	return before == PAGES && after == PAGES && gone && refused ? 0 : 5;
}
