/*
 * xemem_snapshot_release: withdraw a snapshot.
 */
#include "xpmem_internal.h"

/* Withdraws r's snapshot if one is out: its segment is removed, so new gets and attaches
 * fail. Attachers keep the pages they mapped. region_lock held. */
void withdraw_snapshot(struct region *r)
{
	if (!r->published)
		return;
	xpmem_remove(r->snapshot);
	r->published = 0;
	r->snapshot = 0;
}

/*
 * xemem_snapshot_release - withdraws snapshot `segid` of this process: new gets and attaches
 * fail, and the region may be snapshotted (or exported) again. Nothing is copied: the writer's
 * pages are folded into the region's memory by its next snapshot. Readers should have
 * detached; one still attached reads the released version until that next snapshot, and the
 * writer's data from then on.
 *
 * Returns 0, or -1 with errno (ENOENT: not a snapshot of this process that is out).
 */
EXPORT int xemem_snapshot_release(xpmem_segid_t segid)
{
	if (use_device())
		return device_snapshot_release(segid);
	pthread_mutex_lock(&region_lock);
	struct region *r = NULL;
	for (size_t i = 0; i < region_count && !r; i++)
		if (regions[i].published && regions[i].snapshot == segid)
			r = &regions[i];
	if (r)
		withdraw_snapshot(r);
	pthread_mutex_unlock(&region_lock);
	if (!r) {
		errno = ENOENT;
		return -1;
	}
	return 0;
}
