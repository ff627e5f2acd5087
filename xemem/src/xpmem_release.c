/*
 * xpmem_release: give a permit back.
 */
#include "xpmem_internal.h"

/*
 * xpmem_release - gives permit `apid` back (attachments made through it stay until detached;
 * parked ones are dropped).
 *
 * Returns 0, or -1 with errno (EINVAL: non-positive apid; ENOENT: unknown).
 */
EXPORT int xpmem_release(xpmem_apid_t apid)
{
	if (use_device())
		return (int)device_call(XPMEM_CMD_RELEASE, &apid);
	pthread_mutex_lock(&table_lock);
	drop_parked(apid);
	forget_message_permit(apid);
	pthread_mutex_unlock(&table_lock);
	return permit_call(OP_RELEASE, apid);
}
