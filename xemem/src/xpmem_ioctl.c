/*
 * xpmem_ioctl: XPMEM's kernel commands, for programs that issue them directly.
 */
#include "xpmem_internal.h"

/*
 * xpmem_ioctl - issues one XPMEM command (XPMEM_CMD_* or XEMEM_CMD_*, with its struct from
 * xpmem.h) as upstream's libxpmem does with ioctl(2) on /dev/xpmem.
 *
 * On the device backend the command goes to the device unchanged (a child that inherited the
 * descriptor reopens it, as upstream). With no device, the same commands are carried out over
 * the broker by the library's own functions, filling in the struct's out fields, so a program
 * written against the ioctl interface works on either backend. FORK_BEGIN and FORK_END are
 * accepted and do nothing: the library handles fork itself (pthread_atfork).
 *
 * Returns what the command returns (0, or the version for XPMEM_CMD_VERSION), or -1 with
 * errno: EFAULT for a NULL argument, ENOTTY for an unknown command, else the operation's own.
 */
EXPORT int xpmem_ioctl(int cmd, void *arg)
{
	if (use_device())
		return (int)device_call((unsigned)cmd, arg);
	if (!arg && cmd != (int)XPMEM_CMD_VERSION && cmd != (int)XPMEM_CMD_FORK_BEGIN && cmd != (int)XPMEM_CMD_FORK_END) {
		errno = EFAULT;
		return -1;
	}
	switch ((unsigned)cmd) {
	case XPMEM_CMD_VERSION:
		return xpmem_version();
	case XPMEM_CMD_MAKE: {
		struct xpmem_cmd_make *make = arg;
		make->segid = xpmem_make((void *)(uintptr_t)make->vaddr, make->size, make->permit_type,
					 (void *)(uintptr_t)make->permit_value);
		return make->segid < 0 ? -1 : 0;
	}
	case XPMEM_CMD_REMOVE:
		return xpmem_remove(((struct xpmem_cmd_remove *)arg)->segid);
	case XPMEM_CMD_GET: {
		struct xpmem_cmd_get *get = arg;
		get->apid = xpmem_get(get->segid, get->flags, get->permit_type, (void *)(uintptr_t)get->permit_value);
		return get->apid < 0 ? -1 : 0;
	}
	case XPMEM_CMD_RELEASE:
		return xpmem_release(((struct xpmem_cmd_release *)arg)->apid);
	case XPMEM_CMD_ATTACH: {
		struct xpmem_cmd_attach *attach = arg;
		struct xpmem_addr addr = { .apid = attach->apid, .offset = attach->offset };
		void *at = xpmem_attach(addr, attach->size, (void *)(uintptr_t)attach->vaddr);
		if (at == (void *)-1)
			return -1;
		attach->vaddr = (uintptr_t)at;
		return 0;
	}
	case XPMEM_CMD_DETACH:
		return xpmem_detach((void *)(uintptr_t)((struct xpmem_cmd_detach *)arg)->vaddr);
	case XPMEM_CMD_FORK_BEGIN:
	case XPMEM_CMD_FORK_END:
		return 0;
	case XEMEM_CMD_MAKE_NAMED: {
		struct xemem_cmd_make_named *named = arg;
		if (!memchr(named->name, 0, sizeof named->name)) {
			errno = EINVAL;
			return -1;
		}
		named->segid = xemem_make((void *)(uintptr_t)named->vaddr, named->size, named->name);
		return named->segid < 0 ? -1 : 0;
	}
	case XEMEM_CMD_LOOKUP: {
		struct xemem_cmd_lookup *lookup = arg;
		if (!memchr(lookup->name, 0, sizeof lookup->name)) {
			errno = EINVAL;
			return -1;
		}
		lookup->segid = xemem_lookup_segid(lookup->name);
		return lookup->segid < 0 ? -1 : 0;
	}
	case XEMEM_CMD_SIGNAL:
		return xemem_signal(((struct xemem_cmd_signal *)arg)->apid);
	default:
		/* NOTIFY_FD hands out a new descriptor per call on a device; the broker backend's
		 * one descriptor per segment is xemem_notify_fd's. */
		errno = ENOTTY;
		return -1;
	}
}
