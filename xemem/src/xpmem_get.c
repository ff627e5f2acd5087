/*
 * xpmem_get: a permit to attach a segment.
 */
#include "xpmem_internal.h"

/*
 * xpmem_get - a permit (apid) to attach segment `segid`, read-only (XPMEM_RDONLY) or
 * read-write (XPMEM_RDWR). permit_type must be XPMEM_PERMIT_MODE; permit_value is ignored, as
 * XPMEM's library does. Access is checked against the segment's mode like SysV IPC.
 *
 * Returns the apid, or -1 with errno (EINVAL: flags or type; ENOENT: no such segment; EACCES).
 */
EXPORT xpmem_apid_t xpmem_get(xpmem_segid_t segid, int flags, int permit_type, void *permit_value)
{
	(void)permit_value; /* ignored, as XPMEM's library does (Open MPI passes 0666) */
	if (use_device())
		return device_get_access(segid, flags, permit_type);
	if (permit_type != XPMEM_PERMIT_MODE || (flags != XPMEM_RDONLY && flags != XPMEM_RDWR) || segid <= 0) {
		errno = EINVAL;
		return -1;
	}
	struct wire_answer answer;
	uint64_t args[] = { (uint64_t)segid, (uint64_t)flags };
	if (call(OP_GET, args, 2, NULL, &answer) < 0)
		return -1;
	/* Another enclave's segment: serve, so that its removal can reach our attachments. Without
	 * the serving connection they would keep the old pages (documented in docs/xemem.md). */
	xpmem_apid_t apid = (xpmem_apid_t)answer.results[0];
	if (answer.results[2] & WIRE_GET_REVOKED_BY_MESSAGE) {
		ensure_serving();
		pthread_mutex_lock(&table_lock);
		if (grow((void **)&message_permits, &message_permit_capacity, message_permit_count, sizeof *message_permits) == 0)
			message_permits[message_permit_count++] = apid;
		pthread_mutex_unlock(&table_lock);
	}
	return apid;
}
