/*
 * xpmem_version.
 */
#include "xpmem_internal.h"

/*
 * xpmem_version - the XPMEM version: the device's, or XPMEM_CURRENT_VERSION (2.6) when the
 * broker answers.
 *
 * Returns the version, or -1 with errno when neither the device nor a broker is reachable.
 */
EXPORT int xpmem_version(void)
{
	if (use_device())
		return (int)device_call(XPMEM_CMD_VERSION, NULL);
	struct wire_answer answer;
	if (call(OP_HELLO, NULL, 0, NULL, &answer) < 0)
		return -1;
	return XPMEM_CURRENT_VERSION;
}
