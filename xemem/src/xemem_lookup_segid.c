/*
 * xemem_lookup_segid: a named segment's segid.
 */
#include "xpmem_internal.h"

/*
 * xemem_lookup_segid - the segid of the segment made under `name` (xemem_make, here or in
 * any enclave connected to the machine's name server).
 *
 * Returns the segid, or -1 with errno: ENOENT when no segment has that name (yet), EINVAL for
 * a NULL, empty or too long name.
 */
EXPORT xpmem_segid_t xemem_lookup_segid(const char *name)
{
	if (!name || !*name || strlen(name) > XEMEM_NAME_MAX) {
		errno = EINVAL;
		return -1;
	}
	if (use_device()) {
		/* The LWK's device (the XPMEM module has no names: ENOTTY). */
		struct xemem_cmd_lookup lookup = { .segid = -1 };
		memcpy(lookup.name, name, strlen(name) + 1);
		if (device_call(XEMEM_CMD_LOOKUP, &lookup) < 0)
			return -1;
		return lookup.segid;
	}
	struct wire_answer answer;
	if (call(OP_LOOKUP, NULL, 0, name, &answer) < 0)
		return -1;
	return (xpmem_segid_t)answer.results[0];
}
