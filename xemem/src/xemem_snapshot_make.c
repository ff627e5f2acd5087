/*
 * xemem_snapshot_make: publish a region's current contents as a copy-on-write snapshot.
 */
#include "xpmem_internal.h"

/* Whether [lo, hi) overlaps a segment this process made (a whole-address-space one included):
 * an attach of it would convert the writer's private view to a copy. */
static int exported(uintptr_t lo, uintptr_t hi)
{
	pthread_mutex_lock(&table_lock);
	int found = 0;
	for (size_t i = 0; i < segment_count && !found; i++)
		found = lo < segments[i].vaddr + segments[i].size && segments[i].vaddr < hi;
	pthread_mutex_unlock(&table_lock);
	return found;
}

/*
 * xemem_snapshot_make - publishes what the region at `region` (from xemem_region_alloc) holds
 * now as a read-only snapshot segment: permit as xpmem_make's, and a machine-wide name as
 * xemem_make's when `name` is not NULL. Readers attach it as any segment: they map the
 * region's memfd. The writer's view of the memfd is MAP_PRIVATE from the first snapshot on,
 * so its later stores go to copies of the pages they touch, made by the kernel on the first
 * store to each; this call first copies the pages written since the previous snapshot into
 * the memfd (xemem_snapshot_fold.c). So a snapshot costs the pages written, not the region's
 * size. One snapshot per region at a time.
 *
 * Returns the snapshot's segid, or -1 with errno (EINVAL: not a region, a bad permit or name;
 * EBUSY: a snapshot of it is out, or the region lies in a segment of this process; ENOTSUP:
 * the Linux-VM PCI backend; the broker's errnos). On the LWK's device the kernel takes it
 * (page-table copy-on-write, device.c).
 */
EXPORT xpmem_segid_t xemem_snapshot_make(void *region, int permit_type, void *permit_value, const char *name)
{
	if (use_device())
		return device_snapshot_make(region, permit_type, permit_value, name);
	if (permit_type != XPMEM_PERMIT_MODE || (uintptr_t)permit_value & ~0777UL ||
	    (name && (!*name || strlen(name) > XEMEM_NAME_MAX))) {
		errno = EINVAL;
		return -1;
	}
	pthread_mutex_lock(&region_lock);
	struct region *r = region_at((uintptr_t)region);
	int error = 0;
	if (!r)
		error = EINVAL;
	else if (r->published || exported(r->base, r->base + r->size))
		error = EBUSY;
	else if (r->private_view) {
		/* The pages written since the last snapshot go into the memfd, which readers map. */
		if (fold(r, 0) < 0)
			error = errno;
	} else if (/* NORESERVE: a region is address space (an engine's step buffer may span many
		    * GiB, sparsely written); a private writable view is otherwise charged whole
		    * against the commit limit. */
		   mmap((void *)r->base, r->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, r->fd, 0) ==
		   MAP_FAILED) {
		error = errno; /* MAP_FIXED failed before replacing anything: the view is still shared */
	} else {
		r->private_view = 1;
		track_writes(r);
	}
	xpmem_segid_t segid = -1;
	if (!error) {
		/* The segment exports the side view: a shared mapping, so attachers are handed the
		 * memfd itself, which nothing writes while the snapshot is out. */
		segid = make(r->side, r->size, permit_type, permit_value, name);
		if (segid < 0)
			error = errno;
	}
	if (!error) {
		r->published = 1;
		r->snapshot = segid;
	}
	pthread_mutex_unlock(&region_lock);
	if (error) {
		errno = error;
		return -1;
	}
	return segid;
}
