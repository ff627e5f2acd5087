/*
 * xemem_signal: an attacher wakes a segment's owner.
 */
#include "xpmem_internal.h"

/*
 * xemem_signal - an attacher holding permit `apid` wakes the segment's owner (its
 * xemem_notify_fd becomes readable), in this enclave, another one or a host process.
 *
 * Returns 0, or -1 with errno (EINVAL for a non-positive apid, ENOENT for an unknown one).
 */
EXPORT int xemem_signal(xpmem_apid_t apid)
{
	if (use_device()) {
		struct xemem_cmd_signal signal = { .apid = apid };
		return (int)device_call(XEMEM_CMD_SIGNAL, &signal);
	}
	return permit_call(OP_SIGNAL, apid);
}
