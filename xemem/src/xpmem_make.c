/*
 * xpmem_make and xemem_make: export a range of this process.
 */
#include "xpmem_internal.h"

xpmem_segid_t make(void *vaddr, size_t size, int permit_type, void *permit_value, const char *name)
{
	uintptr_t addr = (uintptr_t)vaddr;
	uintptr_t mode = (uintptr_t)permit_value;
	if (permit_type != XPMEM_PERMIT_MODE || mode & ~0777UL || size == 0 || addr % PAGE ||
	    (size != XPMEM_MAXADDR_SIZE && (size % PAGE || addr + size < addr || addr + size > USER_LIMIT))) {
		errno = EINVAL;
		return -1;
	}
	if (name && (!*name || strlen(name) > XEMEM_NAME_MAX)) {
		errno = EINVAL;
		return -1;
	}
	if (ensure_serving() < 0)
		return -1;
	size_t effective = size == XPMEM_MAXADDR_SIZE ? (addr < USER_LIMIT ? USER_LIMIT - addr : 0) : size;
	if (size != XPMEM_MAXADDR_SIZE) {
		/* An explicit range is converted now; the whole address space lazily, per attach. */
		pthread_mutex_lock(&table_lock);
		size_t count;
		free(prepared_maps(addr, addr + size, &count));
		pthread_mutex_unlock(&table_lock);
	}
	struct wire_answer answer;
	uint64_t args[] = { addr, size, mode };
	if (call(OP_MAKE, args, 3, name, &answer) < 0)
		return -1;
	xpmem_segid_t segid = (xpmem_segid_t)answer.results[0];
	pthread_mutex_lock(&table_lock);
	if (grow((void **)&segments, &segment_capacity, segment_count, sizeof *segments) == 0)
		segments[segment_count++] = (struct segment){ .segid = segid, .vaddr = addr, .size = effective, .notify_fd = -1 };
	pthread_mutex_unlock(&table_lock);
	return segid;
}

/*
 * xpmem_make - exports [vaddr, vaddr + size) of this process as a segment, with the SysV-style
 * mode carried in the pointer value: xpmem_make(p, n, XPMEM_PERMIT_MODE, (void *)0600).
 * size XPMEM_MAXADDR_SIZE exports everything from vaddr up (attach offsets are then addresses).
 * Private memory in an explicit range is converted to shared memory now, in place.
 *
 * Returns the segid, or -1 with errno (EINVAL: alignment, range, type or mode; EBUSY: over a
 * region with a snapshot out, see xemem_snapshot_make).
 */
EXPORT xpmem_segid_t xpmem_make(void *vaddr, size_t size, int permit_type, void *permit_value)
{
	if (use_device())
		return device_make_segment(vaddr, size, permit_type, permit_value);
	return make_outside_snapshots(vaddr, size, permit_type, permit_value, NULL);
}

/*
 * xemem_make - xpmem_make with mode 0666 and a machine-wide `name` (1..XEMEM_NAME_MAX printable
 * characters, no spaces) that xemem_lookup_segid finds.
 *
 * Returns the segid, or -1 with errno (EINVAL as xpmem_make or for a bad name, or the
 * broker's errno for a name already taken).
 */
EXPORT xpmem_segid_t xemem_make(void *vaddr, size_t size, const char *name)
{
	if (!name) {
		errno = EINVAL;
		return -1;
	}
	if (use_device()) {
		/* The LWK's device: XEMEM's own command (the XPMEM module has none: ENOTTY). */
		struct xemem_cmd_make_named named = { .vaddr = (uintptr_t)vaddr, .size = size };
		size_t length = strlen(name);
		if (length == 0 || length > XEMEM_NAME_MAX) {
			errno = EINVAL;
			return -1;
		}
		memcpy(named.name, name, length + 1);
		if (device_call(XEMEM_CMD_MAKE_NAMED, &named) < 0)
			return -1;
		return named.segid;
	}
	return make_outside_snapshots(vaddr, size, XPMEM_PERMIT_MODE, (void *)0666, name);
}
