/*
 * xemem_notify_fd: the owner's descriptor for attachers' signals.
 */
#include "xpmem_internal.h"

/* The notify descriptor of this process's segment `segid`, made on first use (by a signal or
 * by xemem_notify_fd, whichever comes first); -1 when there is no such segment or no
 * descriptor could be made. table_lock held. */
int notify_fd_of(xpmem_segid_t segid)
{
	for (size_t i = 0; i < segment_count; i++) {
		if (segments[i].segid != segid)
			continue;
		if (segments[i].notify_fd < 0)
			segments[i].notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		return segments[i].notify_fd;
	}
	return -1;
}

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
	pthread_mutex_lock(&table_lock);
	int fd = notify_fd_of(segid);
	pthread_mutex_unlock(&table_lock);
	if (fd < 0)
		errno = ENOENT;
	return fd;
}
