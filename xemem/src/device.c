/*
 * The /dev/xpmem backend: XPMEM's (or the lightweight kernel's) ioctls instead of the broker.
 */
#include "xpmem_internal.h"

/* Where /dev/xpmem exists (the XPMEM kernel module on Linux, the lightweight kernel's device),
 * the library speaks its ioctls instead of the broker, so one statically linked program runs
 * on the host and in an enclave; in a Linux VM with no /dev/xpmem, the XEMEM PCI device
 * (backend_pci.c). CLOWDER_XEMEM_BACKEND=broker, =device or =pci forces the choice.
 * Commands are _IO('x', n) with XPMEM's x86-64 struct layouts (shared/notes/xpmem-reference.md). */
/* The commands and structs are the public ones in xpmem.h; their layouts must be XPMEM's. */
_Static_assert(XPMEM_CMD_VERSION == 0x7800 && XPMEM_CMD_DETACH == 0x7806, "XPMEM ioctl numbers");
_Static_assert(XEMEM_CMD_MAKE_NAMED == 0x7810 && offsetof(struct xemem_cmd_make_named, segid) == 80,
	       "XEMEM's named make, as the LWK reads it");
_Static_assert(XEMEM_CMD_LOOKUP == 0x7811 && offsetof(struct xemem_cmd_lookup, segid) == 64,
	       "XEMEM's lookup, as the LWK reads it");
_Static_assert(XEMEM_CMD_SIGNAL == 0x7812 && sizeof(struct xemem_cmd_signal) == 8, "signal layout");
_Static_assert(XEMEM_CMD_NOTIFY_FD == 0x7813 && sizeof(struct xemem_cmd_notify_fd) == 16 &&
		       offsetof(struct xemem_cmd_notify_fd, fd) == 12,
	       "notify_fd layout");
_Static_assert(XEMEM_CMD_SNAPSHOT_MAKE == 0x7816 && sizeof(struct xemem_cmd_snapshot_make) == 96 &&
		       offsetof(struct xemem_cmd_snapshot_make, name) == 24 &&
		       offsetof(struct xemem_cmd_snapshot_make, segid) == 88,
	       "snapshot make layout, as the LWK reads it");
_Static_assert(XEMEM_CMD_REGION_ALLOC == 0x7814 && sizeof(struct xemem_cmd_region) == 16, "region layout");
_Static_assert(sizeof(struct xpmem_cmd_make) == 40 && offsetof(struct xpmem_cmd_make, segid) == 32, "make layout");
_Static_assert(sizeof(struct xpmem_cmd_get) == 32 && offsetof(struct xpmem_cmd_get, apid) == 24, "get layout");
_Static_assert(sizeof(struct xpmem_cmd_attach) == 40 && offsetof(struct xpmem_cmd_attach, fd) == 32, "attach layout");

static int device = -1;
static int device_chosen; /* 0 undecided, 1 device, 2 broker */
static int backend_misnamed; /* CLOWDER_XEMEM_BACKEND names none: every call fails */
static int pci_chosen;       /* the device is the Linux-VM PCI device (backend_pci.c) */
static int pci_missing;      /* CLOWDER_XEMEM_BACKEND=pci but no device: every call fails */
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;

int use_device(void)
{
	pthread_mutex_lock(&device_lock);
	if (!device_chosen) {
		const char *forced = getenv("CLOWDER_XEMEM_BACKEND");
		if (forced && strcmp(forced, "broker") && strcmp(forced, "device") && strcmp(forced, "pci")) {
			/* A typo must not silently pick a backend the user did not ask for. */
			fprintf(stderr, "libxpmem: CLOWDER_XEMEM_BACKEND must be 'broker', 'device' or 'pci', not "
					"'%s'; every XPMEM call fails with EINVAL\n", forced);
			backend_misnamed = 1;
			device_chosen = 1;
		} else if (forced && !strcmp(forced, "broker")) {
			device_chosen = 2;
		} else if (forced && !strcmp(forced, "pci")) {
			pci_chosen = pci_probe();
			pci_missing = !pci_chosen;
			device_chosen = 1;
		} else {
			device = open(XPMEM_DEV_PATH, O_RDWR | O_CLOEXEC);
			/* No /dev/xpmem: a Linux VM's XEMEM PCI device (backend_pci.c), else the broker. */
			pci_chosen = device < 0 && !forced && pci_probe();
			device_chosen = device >= 0 || pci_chosen || (forced && !strcmp(forced, "device")) ? 1 : 2;
		}
	}
	int chosen = device_chosen == 1;
	pthread_mutex_unlock(&device_lock);
	return chosen;
}

/* Opens the device now (xpmem_init): 0, or -1 with errno. */
int device_open(void)
{
	if (backend_misnamed || pci_missing) {
		errno = backend_misnamed ? EINVAL : ENODEV;
		return -1;
	}
	if (pci_chosen)
		return 0;
	pthread_mutex_lock(&device_lock);
	if (device < 0)
		device = open(XPMEM_DEV_PATH, O_RDWR | O_CLOEXEC);
	int opened = device >= 0;
	pthread_mutex_unlock(&device_lock);
	return opened ? 0 : -1;
}

/* One ioctl; a child that inherited the descriptor gets XPMEM_ERRNO_NOPROC and retries on a
 * fresh one, as XPMEM's library does. */
long device_call(unsigned long command, void *argument)
{
	if (backend_misnamed || pci_missing) {
		errno = backend_misnamed ? EINVAL : ENODEV;
		return -1;
	}
	if (pci_chosen)
		return pci_call(command, argument);
	for (int attempt = 0; attempt < 2; attempt++) {
		pthread_mutex_lock(&device_lock);
		if (device < 0)
			device = open(XPMEM_DEV_PATH, O_RDWR | O_CLOEXEC);
		int fd = device;
		pthread_mutex_unlock(&device_lock);
		if (fd < 0)
			return -1;
		long result = ioctl(fd, command, argument);
		if (result >= 0 || errno != XPMEM_ERRNO_NOPROC)
			return result;
		pthread_mutex_lock(&device_lock);
		if (device == fd) {
			close(device);
			device = -1;
		}
		pthread_mutex_unlock(&device_lock);
	}
	return -1;
}

xpmem_segid_t device_make_segment(void *vaddr, size_t size, int permit_type, void *permit_value)
{
	struct xpmem_cmd_make make = { .vaddr = (uintptr_t)vaddr, .size = size, .permit_type = permit_type,
				    .permit_value = (uintptr_t)permit_value };
	if (device_call(XPMEM_CMD_MAKE, &make) < 0)
		return -1;
	return make.segid;
}

xpmem_apid_t device_get_access(xpmem_segid_t segid, int flags, int permit_type)
{
	/* NULL permit value, as XPMEM's library sends: the kernel refuses anything else. */
	struct xpmem_cmd_get get = { .segid = segid, .flags = flags, .permit_type = permit_type };
	if (device_call(XPMEM_CMD_GET, &get) < 0)
		return -1;
	return get.apid;
}

void *device_attach_segment(struct xpmem_addr addr, size_t size, void *vaddr)
{
	struct xpmem_cmd_attach attach = { .apid = addr.apid, .offset = addr.offset, .size = size,
					.vaddr = (uintptr_t)vaddr };
	if (device_call(XPMEM_CMD_ATTACH, &attach) < 0)
		return (void *)-1;
	return (void *)(uintptr_t)attach.vaddr;
}

/* On a device: the notification descriptors the library asked for, by process and segment
 * (a fork child does not own its parent's segments, so it never reuses their descriptors). */
struct device_notify {
	pid_t pid;
	xpmem_segid_t segid;
	int fd;
};
static struct device_notify *device_notifies;
static size_t device_notify_count, device_notify_capacity;

/* Closes and forgets this process's descriptor for segid (its segment was removed). */
void device_notify_forget(xpmem_segid_t segid)
{
	pid_t me = getpid();
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < device_notify_count; i++) {
		if (device_notifies[i].pid != me || device_notifies[i].segid != segid)
			continue;
		close(device_notifies[i].fd);
		device_notifies[i] = device_notifies[--device_notify_count];
		break;
	}
	pthread_mutex_unlock(&table_lock);
}

/* This process's notification descriptor for segid, asked of the device once. */
int device_notify_fd(xpmem_segid_t segid)
{
	pid_t me = getpid();
	int fd = -1;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < device_notify_count && fd < 0; i++)
		if (device_notifies[i].pid == me && device_notifies[i].segid == segid)
			fd = device_notifies[i].fd;
	if (fd < 0) {
		struct xemem_cmd_notify_fd notify = { .segid = segid, .flags = O_NONBLOCK | O_CLOEXEC, .fd = -1 };
		if (device_call(XEMEM_CMD_NOTIFY_FD, &notify) == 0) {
			if (grow((void **)&device_notifies, &device_notify_capacity, device_notify_count,
				 sizeof *device_notifies) < 0) {
				close(notify.fd);
				errno = ENOMEM;
			} else {
				device_notifies[device_notify_count++] =
					(struct device_notify){ .pid = me, .segid = segid, .fd = notify.fd };
				fd = notify.fd;
			}
		}
	}
	pthread_mutex_unlock(&table_lock);
	return fd;
}

/* Snapshots on the device: the lightweight kernel keeps regions and snapshots itself
 * (page-table copy-on-write), so these only carry the calls; the Linux-VM PCI device has none. */
static int snapshots_unsupported(void)
{
	if (!pci_chosen)
		return 0;
	errno = ENOTSUP;
	return 1;
}

void *device_region_alloc(size_t size)
{
	struct xemem_cmd_region region = { .size = size };
	if (snapshots_unsupported() || device_call(XEMEM_CMD_REGION_ALLOC, &region) < 0)
		return (void *)-1;
	return (void *)(uintptr_t)region.vaddr;
}

int device_region_free(void *base)
{
	struct xemem_cmd_region region = { .vaddr = (uintptr_t)base };
	if (snapshots_unsupported())
		return -1;
	return device_call(XEMEM_CMD_REGION_FREE, &region) < 0 ? -1 : 0;
}

xpmem_segid_t device_snapshot_make(void *base, int permit_type, void *permit_value, const char *name)
{
	struct xemem_cmd_snapshot_make make = { .vaddr = (uintptr_t)base, .permit_type = permit_type,
					     .permit_value = (uintptr_t)permit_value };
	if (snapshots_unsupported())
		return -1;
	if (name && (!*name || strlen(name) > XEMEM_NAME_MAX)) {
		errno = EINVAL;
		return -1;
	}
	if (name)
		memcpy(make.name, name, strlen(name) + 1);
	if (device_call(XEMEM_CMD_SNAPSHOT_MAKE, &make) < 0)
		return -1;
	return make.segid;
}

int device_snapshot_release(xpmem_segid_t segid)
{
	struct xemem_cmd_snapshot_release release = { .segid = segid };
	if (snapshots_unsupported())
		return -1;
	return device_call(XEMEM_CMD_SNAPSHOT_RELEASE, &release) < 0 ? -1 : 0;
}
