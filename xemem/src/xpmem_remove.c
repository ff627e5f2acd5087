/*
 * xpmem_remove: withdraw a segment and revoke what its attachers map.
 */
#include "xpmem_internal.h"

/* Revokes what attachers of [lo, hi) map: every backing mapped there that was handed out is
 * left by all our mappings of it (their pages move to fresh memfds), then cut to zero length,
 * so its attachers see SIGBUS. table_lock held. */
static void revoke_range(uintptr_t lo, uintptr_t hi)
{
	size_t count;
	struct placement *inside = placements(lo, hi, &count);
	if (!inside)
		return;
	/* The backings to revoke, by inode (indices shift as backings are added and dropped). */
	ino_t *victims = malloc((count ? count : 1) * sizeof *victims);
	size_t nvictims = 0;
	for (size_t i = 0; victims && i < count; i++)
		if (backings[inside[i].backing].handed_out)
			victims[nvictims++] = backings[inside[i].backing].ino;
	free(inside);
	for (size_t v = 0; v < nvictims; v++) {
		size_t n;
		struct placement *where = placements(0, UINTPTR_MAX, &n);
		size_t index = SIZE_MAX;
		for (size_t b = 0; b < backing_count; b++)
			if (backings[b].ino == victims[v])
				index = b;
		if (!where || index == SIZE_MAX) {
			free(where);
			continue;
		}
		int kept_all = 1;
		for (size_t i = 0; i < n; i++) {
			if (where[i].backing != index)
				continue;
			int fd = move_to_memfd(where[i].start, where[i].end - where[i].start, where[i].prot);
			if (fd < 0 || add_backing(fd, where[i].end - where[i].start) < 0) {
				kept_all = fd >= 0; /* out of memory: attachers keep access rather than we lose data */
				if (fd >= 0)
					close(fd);
			}
		}
		free(where);
		if (!kept_all)
			continue;
		for (size_t b = 0; b < backing_count; b++) {
			if (backings[b].ino != victims[v])
				continue;
			if (ftruncate(backings[b].fd, 0) < 0) {
				/* a memfd can always be truncated unless sealed, and ours are not */
			}
			drop_backing(b);
			break;
		}
	}
	free(victims);
}

/*
 * xpmem_remove - withdraws segment `segid`: new gets fail, and every attachment of it raises
 * SIGBUS on its next touch (the owner keeps its memory, moved off the backing it handed out).
 *
 * Returns 0, or -1 with errno (EINVAL: non-positive segid; ENOENT: unknown; EACCES: not ours).
 */
EXPORT int xpmem_remove(xpmem_segid_t segid)
{
	if (use_device()) {
		int removed = (int)device_call(XPMEM_CMD_REMOVE, &segid);
		if (removed == 0)
			device_notify_forget(segid);
		return removed;
	}
	struct wire_answer answer;
	uint64_t args[] = { (uint64_t)segid };
	if (segid <= 0) {
		errno = EINVAL;
		return -1;
	}
	if (call(OP_REMOVE, args, 1, NULL, &answer) < 0)
		return -1;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < segment_count; i++) {
		if (segments[i].segid != segid)
			continue;
		prune_backings();
		revoke_range(segments[i].vaddr, segments[i].vaddr + segments[i].size);
		if (segments[i].notify_fd >= 0)
			close(segments[i].notify_fd);
		segments[i] = segments[--segment_count];
		break;
	}
	pthread_mutex_unlock(&table_lock);
	return 0;
}
