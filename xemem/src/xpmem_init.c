/*
 * xpmem_init: connect to XPMEM ahead of the first call.
 */
#include "xpmem_internal.h"

/*
 * xpmem_init - opens the library's way to XPMEM now rather than on the first call.
 *
 * Upstream's libxpmem opens /dev/xpmem here. This library does that on the device backend, and
 * on the broker backend connects to the segment broker and greets it, so a program that calls
 * xpmem_init learns at start whether XPMEM is reachable. Every other call does this by itself:
 * calling xpmem_init is never required (UCX's configure only checks that it links).
 *
 * Returns 0, or -1 with errno (ENOENT/EACCES for the device, ECONNREFUSED or ENOENT when no
 * broker listens, EINVAL when CLOWDER_XEMEM_BACKEND names no backend).
 */
EXPORT int xpmem_init(void)
{
	if (use_device())
		return device_open();
	struct wire_answer answer;
	return call(OP_HELLO, NULL, 0, NULL, &answer) < 0 ? -1 : 0;
}
