/*
 * xemem_region_alloc and xemem_region_free: the memfd-backed regions that snapshots are taken
 * of, and the table of them.
 *
 * Why memfd: a snapshot must be shareable without copying the region, so the region's pages
 * live in a file from the start. Taking a snapshot maps the writer's view of that file
 * MAP_PRIVATE (the kernel then copies each page the writer stores into), while the file itself,
 * the snapshot, is what readers map (xemem_snapshot_make.c, xemem_snapshot_release.c).
 */
#include "xpmem_internal.h"

/* Guards the table below; taken before call_lock and table_lock. */
pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
struct region *regions;
size_t region_count, region_capacity;

/* The region that starts at `base`, or NULL. region_lock held. */
struct region *region_at(uintptr_t base)
{
	for (size_t i = 0; i < region_count; i++)
		if (regions[i].base == base)
			return &regions[i];
	return NULL;
}

/* make() for xpmem_make and xemem_make. A region in the range with a snapshot out refuses
 * (EBUSY); one whose view is private is folded back to shared first, since an attach would
 * otherwise convert the view to a copy of its own, away from the region's file. region_lock
 * is held across, so that no snapshot is taken of the range meanwhile. */
xpmem_segid_t make_outside_snapshots(void *vaddr, size_t size, int permit_type, void *permit_value, const char *name)
{
	uintptr_t lo = (uintptr_t)vaddr;
	uintptr_t hi = size == XPMEM_MAXADDR_SIZE || lo + size < lo ? UINTPTR_MAX : lo + size;
	pthread_mutex_lock(&region_lock);
	int error = 0;
	for (size_t i = 0; i < region_count && !error; i++) {
		struct region *r = &regions[i];
		if (hi <= r->base || r->base + r->size <= lo)
			continue;
		if (r->published)
			error = EBUSY;
		else if (r->private_view && fold(r, 1) < 0)
			error = errno;
	}
	xpmem_segid_t segid = -1;
	if (error)
		errno = error;
	else
		segid = make(vaddr, size, permit_type, permit_value, name);
	int saved = errno;
	pthread_mutex_unlock(&region_lock);
	errno = saved;
	return segid;
}

/*
 * xemem_region_alloc - a new zero-filled, read-write region of `size` bytes (rounded up to
 * whole pages) that xemem_snapshot_make can publish snapshots of: shared memory on a memfd,
 * mapped where the kernel chooses.
 *
 * Returns its address, or (void *)-1 with errno (EINVAL: size 0 or too large; ENOMEM;
 * ENOTSUP: the Linux-VM PCI backend, which has no snapshots). On the LWK's device the kernel
 * makes the region (device.c).
 */
EXPORT void *xemem_region_alloc(size_t size)
{
	if (use_device())
		return device_region_alloc(size);
	if (size == 0 || size > USER_LIMIT) {
		errno = EINVAL;
		return (void *)-1;
	}
	size_t len = (size + PAGE - 1) & ~(PAGE - 1);
	int fd = memfd_create("xemem-region", MFD_CLOEXEC);
	if (fd < 0)
		return (void *)-1;
	void *base = MAP_FAILED, *side = MAP_FAILED;
	if (ftruncate(fd, (off_t)len) == 0)
		base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	/* The side view is never remapped, so the pages written back through it stay mapped
	 * from one snapshot to the next: a write-back costs copies, not faults. */
	if (base != MAP_FAILED)
		side = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	pthread_mutex_lock(&region_lock);
	int error = side == MAP_FAILED ? (errno ? errno : ENOMEM) : 0;
	if (!error && grow((void **)&regions, &region_capacity, region_count, sizeof *regions) < 0)
		error = ENOMEM;
	if (!error)
		regions[region_count++] = (struct region){ .base = (uintptr_t)base, .size = len, .fd = fd, .side = side, .uffd = -1 };
	pthread_mutex_unlock(&region_lock);
	if (error) {
		if (base != MAP_FAILED)
			munmap(base, len);
		if (side != MAP_FAILED)
			munmap(side, len);
		close(fd);
		errno = error;
		return (void *)-1;
	}
	return base;
}

/*
 * xemem_region_free - unmaps the region at `region` and forgets it; a snapshot of it that is
 * out is withdrawn first (its readers keep the pages they mapped until they detach).
 *
 * Returns 0, or -1 with errno (EINVAL: not the address of a region of this process).
 */
EXPORT int xemem_region_free(void *region)
{
	if (use_device())
		return device_region_free(region);
	pthread_mutex_lock(&region_lock);
	struct region *r = region_at((uintptr_t)region);
	if (!r) {
		pthread_mutex_unlock(&region_lock);
		errno = EINVAL;
		return -1;
	}
	withdraw_snapshot(r);
	untrack_writes(r);
	munmap((void *)r->base, r->size);
	munmap(r->side, r->size);
	close(r->fd);
	*r = regions[--region_count];
	pthread_mutex_unlock(&region_lock);
	return 0;
}
