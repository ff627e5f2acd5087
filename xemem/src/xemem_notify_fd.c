/*
 * xemem_notify_fd: the owner's descriptor for attachers' signals.
 */
#include "xpmem_internal.h"

/*
 * xemem_notify_fd - the owner's side of xemem_signal: a non-blocking eventfd-like descriptor
 * for this process's segment `segid` that becomes readable when attachers signal it; read(2)
 * gives an 8-byte count of signals since the last read. The library owns the descriptor (one
 * per segment; closed by xpmem_remove).
 *
 * Returns the descriptor, or -1 with errno (ENOENT: not a segment of this process).
 */
EXPORT int xemem_notify_fd(xpmem_segid_t segid)
{
	if (use_device())
		return device_notify_fd(segid);
	int fd = -1;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < segment_count; i++) {
		if (segments[i].segid != segid)
			continue;
		if (segments[i].notify_fd < 0)
			segments[i].notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		fd = segments[i].notify_fd;
	}
	pthread_mutex_unlock(&table_lock);
	if (fd < 0)
		errno = ENOENT;
	return fd;
}
