/*
 * The Linux-VM backend: XPMEM through clowder's virtual PCI device (docs/xemem-pci.md), with no
 * guest kernel module. The device is found in sysfs by its vendor and device ids; its mailbox
 * BAR (resource0) carries requests to the host, and its window BAR (resource2) is where the host
 * places attached segments, so an attachment is a part of resource2 mapped in this process. An
 * export names
 * the owner's guest-physical pages: they are pinned with mlock and translated through
 * /proc/self/pagemap (root in the guest), then sent as runs of contiguous frames.
 *
 * The window is mapped through /dev/mem (its physical base read from the device's sysfs
 * `resource` file) rather than resource2: sysfs maps a BAR uncached (pgprot_noncached), while
 * /dev/mem opened without O_SYNC asks for write-back, which the guest kernel grants for a range
 * no driver claims (with PAT, where the guest's MTRRs make it write-back; else it quietly gives
 * UC- again). Where /dev/mem cannot be had (no CONFIG_DEVMEM, lockdown, not root) the window is
 * mapped through resource2, said once on stderr. CLOWDER_XEMEM_PCI_MAP=sysfs chooses resource2,
 * =devmem (or unset) /dev/mem; any other value is refused and the device is not used.
 *
 * The window's mappings are kept (struct pci_extent): the guest kernel maps a PCI resource
 * eagerly, one page-table entry per 4 KiB (remap_pfn_range), and on a PVM host every guest
 * kernel instruction is emulated (seconds per GiB), so a part of the window is mapped once per
 * process and every later attachment placed inside it costs the guest kernel nothing; its first
 * touches are the host's (shadow paging or EPT) faults. Mapping the whole 64 GiB BAR up front
 * would be 16 Mi entries and 128 MiB of page tables, so parts are mapped as placements need
 * them. After a detach the addresses stay mapped and read the window as it is there (all ones,
 * or a later attachment of this guest: the guest is one trust domain, and any of its root
 * processes may map resource2 whole).
 * device.c routes the XPMEM commands here when this backend is chosen.
 *
 * Two things outlive the calling process, because the guest kernel knows nothing of XEMEM:
 *  - Its exports' pages. The guest kernel frees them when the process ends, while host
 *    attachers still map them, so each export's pages are also held by pipes (vmsplice takes a
 *    reference to every page) whose read ends go to the enclave agent's keeper
 *    (kernels/linux-guest/agent/src/xemem_keeper.rs) over a unix socket: when this process's
 *    connection closes (it ended, however), the keeper removes what it still exported and only
 *    then lets the pages go. Without a keeper (a guest without clowder's agent) exports work but
 *    that hole stays open: said once on stderr.
 *  - The mailbox, which every guest process shares: a word in a shared file (/run) holds the pid
 *    of the process using it (the guest kernel has no file locking), taken over from a process
 *    that died holding it.
 * The agent also delivers what the guest kernel cannot: each attachment is noted on its board
 * (pci_board.c: stores to a shared file, no message), so that a touch of a revoked placement,
 * which the VMM sees and reports through the daemon, ends in SIGBUS for this process (sent by
 * the agent: si_code SI_USER, milliseconds after the touch, which reads all ones until then);
 * and an owner's notify descriptor is an eventfd handed to the keeper (NOTIFY), which writes it
 * for each signal the daemon forwards to the segment.
 */
#include "xpmem_internal.h"
/* The device's ids and the mailbox's layout (from xemem/protocol/src/pci.rs, checked there). */
#include "pci_mailbox.h"

#include <sys/uio.h>
#include <time.h>

#define PCI_SYSFS "/sys/bus/pci/devices"
#define PFN_MASK ((1ULL << 55) - 1)
#define PAGE_PRESENT (1ULL << 63)

/* An export: its pages stay locked until it is removed; `tag` names it to the keeper. */
struct pci_export {
	xpmem_segid_t segid;
	uintptr_t vaddr;
	size_t size;
	uint64_t tag;
};

/* The keeper's messages (one per SOCK_SEQPACKET record; KEEP carries pipes and NOTIFY an eventfd
 * as SCM_RIGHTS): `tag` and `segid` are the words a and b of xemem/protocol/src/pci.rs. */
struct keeper_message {
	uint32_t op, reserved;
	uint64_t tag;
	int64_t segid;
};
_Static_assert(sizeof(struct keeper_message) == PCI_KEEPER_MESSAGE, "keeper message layout");
/* Pages one pipe holds at most: 64 MiB, a kernel array of 16 Ki pipe buffers (640 KiB). */
#define PIPE_PAGES 16384UL
/* Pipes per KEEP message (SCM_RIGHTS takes at most 253 descriptors). */
#define PIPES_PER_MESSAGE 64

/* An attachment: `len` bytes of the window at `window_offset`, seen at `vaddr`; `own_mapping`
 * when it was mapped for it alone (at the caller's address) and goes with it; its slot on the
 * attachment board (-1: none). */
struct pci_attachment {
	uintptr_t vaddr;
	size_t len;
	uint64_t window_offset;
	int own_mapping, board_slot;
};

/* A part of the window mapped in this process and kept (the module comment says why). */
struct pci_extent {
	uintptr_t vaddr;
	uint64_t window_offset, len;
};
/* Placements are 2 MiB-aligned in units of 2 MiB (vmm/core/src/pci/window.rs): an extent covers
 * whole units, so a later placement of the same units finds it. */
#define PCI_PLACEMENT_UNIT (2UL << 20)

static pthread_mutex_t pci_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile struct pci_mailbox *mailbox;
static int window_fd = -1;
static uint64_t window_base; /* where window offset 0 is in window_fd: 0 for resource2 */
static _Atomic uint32_t *mailbox_user; /* the shared word naming the process using the mailbox */
static int keeper = -2;                  /* the keeper's socket; -1: none; -2: not tried yet */
static uint64_t next_tag;
static struct pci_export *exports;
static size_t export_count, export_capacity;
static struct pci_attachment *pci_attachments;
static size_t pci_attachment_count, pci_attachment_capacity;
static struct pci_extent *pci_extents;
static size_t pci_extent_count, pci_extent_capacity;

static int read_id(const char *dir, const char *file, unsigned *id)
{
	char path[PATH_MAX], text[16] = "";
	snprintf(path, sizeof path, "%s/%s", dir, file);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t got = read(fd, text, sizeof text - 1);
	close(fd);
	char *end;
	unsigned long value = strtoul(text, &end, 16);
	if (got <= 0 || end == text || value > 0xffff)
		return -1;
	*id = (unsigned)value;
	return 0;
}

/* Maps the word naming the mailbox's user ($CLOWDER_XEMEM_PCI_LOCK, default /run/xemem-pci.lock);
 * without it (no writable /run) requests go unserialized, as in a guest with one XPMEM process. */
static void map_mailbox_user(void)
{
	const char *path;
	mailbox_user = pci_map_run_file("CLOWDER_XEMEM_PCI_LOCK", "/run/xemem-pci.lock", PAGE, &path);
	if (!mailbox_user)
		fprintf(stderr, "libxpmem: %s: %s (XEMEM calls of several guest processes may collide)\n", path,
			strerror(errno));
}

/* A file every guest process shares ($ENV, else `fallback` in /run), made (mode 0600) and grown
 * to `size` if need be, mapped shared: the mapping, or NULL with errno; *path names the file. */
void *pci_map_run_file(const char *env, const char *fallback, size_t size, const char **path)
{
	const char *named = getenv(env);
	*path = named && *named ? named : fallback;
	int fd = open(*path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct stat st;
	void *map = MAP_FAILED;
	if (fd >= 0 && fstat(fd, &st) == 0 && (st.st_size >= (off_t)size || ftruncate(fd, (off_t)size) == 0))
		map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int error = errno;
	if (fd >= 0)
		close(fd);
	errno = error;
	return map == MAP_FAILED ? NULL : map;
}

/* The window BAR's guest-physical base from the device's sysfs `resource` file (one "start end
 * flags" line per resource): 0, or -1 with a reason in `why`. */
static int read_window_base(const char *dir, uint64_t *base, const char **why)
{
	char path[PATH_MAX + 16], line[128];
	snprintf(path, sizeof path, "%s/resource", dir);
	FILE *f = fopen(path, "re");
	if (!f) {
		*why = strerror(errno);
		return -1;
	}
	unsigned long long start = 0, end = 0;
	int found = 0;
	for (int i = 0; i <= 2 && fgets(line, sizeof line, f); i++)
		found = i == 2 && sscanf(line, "%llx %llx", &start, &end) == 2;
	fclose(f);
	if (!found || start == 0 || end <= start || start % PAGE) {
		*why = "no window BAR in its resource file (the guest kernel did not assign it)";
		return -1;
	}
	*base = start;
	return 0;
}

/* $CLOWDER_XEMEM_PCI_MAP: how the window is mapped, 'devmem' (the default, unset or empty) or
 * 'sysfs': 0 or 1, or -1 for anything else, said on stderr (a typo must not quietly pick one). */
static int window_through_sysfs(void)
{
	const char *how = getenv("CLOWDER_XEMEM_PCI_MAP");
	if (!how || !*how || !strcmp(how, "devmem"))
		return 0;
	if (!strcmp(how, "sysfs"))
		return 1;
	fprintf(stderr, "libxpmem: CLOWDER_XEMEM_PCI_MAP must be 'devmem' or 'sysfs', not '%s'; the XEMEM PCI device is not used\n",
		how);
	return -1;
}

/* Opens what the window is mapped through (the module comment says why /dev/mem first), with
 * the window's base in it; -1 with errno. $CLOWDER_XEMEM_PCI_MEM replaces /dev/mem (the tests). */
static int open_window(const char *dir, uint64_t *base, int sysfs)
{
	if (!sysfs) {
		const char *mem = getenv("CLOWDER_XEMEM_PCI_MEM");
		mem = mem && *mem ? mem : "/dev/mem";
		const char *what = mem, *why = NULL;
		int fd = -1;
		if (read_window_base(dir, base, &why) < 0) {
			what = dir;
		} else if ((fd = open(mem, O_RDWR | O_CLOEXEC)) < 0) {
			why = strerror(errno);
		} else {
			/* A page mapped now, so a kernel that refuses the range (STRICT_DEVMEM, a driver
			 * holding the BAR) is found here rather than at the first attach. */
			void *probe = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, (off_t)*base);
			if (probe != MAP_FAILED) {
				munmap(probe, PAGE);
				return fd;
			}
			why = strerror(errno);
			close(fd);
		}
		fprintf(stderr, "libxpmem: %s: %s: the XEMEM window is mapped through resource2, uncached\n", what, why);
	}
	*base = 0;
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/resource2", dir);
	return open(path, O_RDWR | O_CLOEXEC);
}

/* Looks for the device and maps its mailbox: 1 found, 0 absent (or unusable, said on stderr).
 * $CLOWDER_XEMEM_PCI_SYSFS replaces /sys/bus/pci/devices (the tests' fake tree). */
int pci_probe(void)
{
	const char *root = getenv("CLOWDER_XEMEM_PCI_SYSFS");
	root = root && *root ? root : PCI_SYSFS;
	int sysfs = window_through_sysfs();
	if (sysfs < 0)
		return 0;
	DIR *dir = opendir(root);
	if (!dir)
		return 0;
	int found = 0;
	struct dirent *entry;
	while (!found && (entry = readdir(dir))) {
		char path[PATH_MAX];
		unsigned vendor, device;
		if (entry->d_name[0] == '.' || snprintf(path, sizeof path, "%s/%s", root, entry->d_name) >= (int)sizeof path)
			continue;
		if (read_id(path, "vendor", &vendor) < 0 || read_id(path, "device", &device) < 0 ||
		    vendor != PCI_VENDOR || device != PCI_DEVICE)
			continue;
		char resource[PATH_MAX + 16];
		snprintf(resource, sizeof resource, "%s/resource0", path);
		int mailbox_fd = open(resource, O_RDWR | O_CLOEXEC);
		int window = open_window(path, &window_base, sysfs);
		void *map = mailbox_fd < 0 ? MAP_FAILED
					   : mmap(NULL, PCI_MAILBOX_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, mailbox_fd, 0);
		if (mailbox_fd >= 0)
			close(mailbox_fd);
		if (map == MAP_FAILED || window < 0 || ((volatile struct pci_mailbox *)map)->magic != PCI_MAGIC) {
			fprintf(stderr, "libxpmem: the XEMEM PCI device at %s is unusable (%s)\n", path,
				map == MAP_FAILED || window < 0 ? strerror(errno) : "its mailbox has no XEMP magic");
			if (map != MAP_FAILED)
				munmap(map, PCI_MAILBOX_SIZE);
			if (window >= 0)
				close(window);
			break;
		}
		mailbox = map;
		window_fd = window;
		map_mailbox_user();
		found = 1;
	}
	closedir(dir);
	return found;
}

/* How long a request may wait for the host: a host that never answers must not hang the
 * caller. $CLOWDER_XEMEM_PCI_TIMEOUT_MS, default 10 s. */
static long timeout_ms(void)
{
	const char *text = getenv("CLOWDER_XEMEM_PCI_TIMEOUT_MS");
	long ms = text ? strtol(text, NULL, 10) : 0;
	return ms > 0 ? ms : 10000;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Takes the mailbox for this process: 0, or -1 with ETIMEDOUT when a live process kept it past
 * the timeout. A user that no longer exists (killed mid-request) is replaced. */
static int take_mailbox(void)
{
	if (!mailbox_user)
		return 0;
	uint32_t me = (uint32_t)getpid();
	uint64_t deadline = now_ms() + timeout_ms();
	for (unsigned spins = 0;; spins++) {
		uint32_t user = 0;
		if (atomic_compare_exchange_strong(mailbox_user, &user, me) || user == me)
			return 0;
		if (spins % 64 == 63 && kill((pid_t)user, 0) < 0 && errno == ESRCH &&
		    atomic_compare_exchange_strong(mailbox_user, &user, me))
			return 0;
		if (now_ms() > deadline) {
			errno = ETIMEDOUT;
			return -1;
		}
		sched_yield();
	}
}

static void give_mailbox_back(void)
{
	uint32_t me = (uint32_t)getpid();
	if (mailbox_user)
		atomic_compare_exchange_strong(mailbox_user, &me, 0);
}

/* One request (the fields other than op are already in the mailbox), with pci_lock held.
 * On a VM the doorbell write exits to the VMM, which answers before the guest resumes; the
 * wait only matters for hosts that answer asynchronously (the tests' fake). */
static int request(uint32_t op)
{
	mailbox->op = op;
	mailbox->error = 0;
	/* Other processes' requests moved `done` on since ours: the next number follows it. */
	uint32_t seq = __atomic_load_n(&mailbox->done, __ATOMIC_ACQUIRE) + 1;
	__atomic_store_n(&mailbox->doorbell, seq, __ATOMIC_RELEASE);
	uint64_t deadline = now_ms() + timeout_ms();
	for (unsigned spins = 0; __atomic_load_n(&mailbox->done, __ATOMIC_ACQUIRE) != seq; spins++) {
		if (spins > 1000) {
			if (now_ms() > deadline) {
				errno = ETIMEDOUT;
				return -1;
			}
			sched_yield();
		}
	}
	if (mailbox->error) {
		errno = mailbox->error > 0 && mailbox->error < 4096 ? mailbox->error : EIO;
		return -1;
	}
	return 0;
}

static int set_name(const char *name)
{
	size_t len = strnlen(name, XEMEM_NAME_MAX + 1);
	if (len == 0 || len > XEMEM_NAME_MAX) {
		errno = EINVAL;
		return -1;
	}
	for (size_t i = 0; i < sizeof mailbox->name; i++)
		mailbox->name[i] = i < len ? name[i] : 0;
	return 0;
}

/* Sends the guest-physical runs of [vaddr, vaddr+size) (locked by the caller) in chunks the
 * mailbox holds: 0, or -1 with errno (EPERM when pagemap hides frame numbers: not root). */
static int send_runs(uintptr_t vaddr, size_t size, uint64_t *total)
{
	int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pagemap < 0)
		return -1;
	uint64_t entries[512];
	size_t pages = size / PAGE, chunk = 0;
	struct pci_run run = { 0, 0 };
	*total = 0;
	int status = 0;
	for (size_t done = 0; done < pages && !status;) {
		size_t want = pages - done < 512 ? pages - done : 512;
		ssize_t got = pread(pagemap, entries, want * 8, (off_t)((vaddr / PAGE + done) * 8));
		if (got <= 0 || got % 8) {
			errno = got < 0 ? errno : EFAULT;
			status = -1;
			break;
		}
		for (size_t i = 0; i < (size_t)got / 8 && !status; i++) {
			uint64_t pfn = entries[i] & PFN_MASK;
			if (!(entries[i] & PAGE_PRESENT) || !pfn) {
				/* Locked pages are present, so a zero frame means pagemap hides them. */
				errno = entries[i] & PAGE_PRESENT ? EPERM : EFAULT;
				status = -1;
				break;
			}
			if (run.len && run.gpa + run.len == pfn * PAGE) {
				run.len += PAGE;
				continue;
			}
			if (run.len) {
				mailbox->runs[chunk].gpa = run.gpa;
				mailbox->runs[chunk].len = run.len;
				if (++chunk == PCI_MAX_RUNS) {
					mailbox->nruns = chunk;
					mailbox->args[0] = *total;
					status = request(PCI_OP_RUNS);
					*total += chunk;
					chunk = 0;
				}
			}
			run = (struct pci_run){ pfn * PAGE, PAGE };
		}
		done += (size_t)got / 8;
	}
	close(pagemap);
	if (status || !run.len)
		return status;
	mailbox->runs[chunk].gpa = run.gpa;
	mailbox->runs[chunk].len = run.len;
	mailbox->nruns = ++chunk;
	mailbox->args[0] = *total;
	*total += chunk;
	return request(PCI_OP_RUNS);
}

/* The keeper's socket, connected on first use ($CLOWDER_XEMEM_KEEPER: its abstract name), or -1. */
static int keeper_socket(void)
{
	if (keeper != -2)
		return keeper;
	const char *name = getenv("CLOWDER_XEMEM_KEEPER");
	name = name && *name ? name : "clowder-xemem-keeper";
	struct sockaddr_un address = { .sun_family = AF_UNIX };
	size_t len = strnlen(name, sizeof address.sun_path - 2);
	memcpy(address.sun_path + 1, name, len);
	keeper = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (keeper >= 0 &&
	    connect(keeper, (struct sockaddr *)&address, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) < 0) {
		fprintf(stderr,
			"libxpmem: no XEMEM keeper in this guest (%s): an export's pages are freed if this process ends "
			"without removing it\n",
			strerror(errno));
		close(keeper);
		keeper = -1;
	}
	return keeper;
}

/* One message to the keeper, with `count` descriptors. */
static int keeper_send(uint32_t op, uint64_t tag, int64_t segid, const int *fds, size_t count)
{
	struct keeper_message message = { .op = op, .tag = tag, .segid = segid };
	struct iovec iov = { &message, sizeof message };
	union {
		struct cmsghdr header;
		char space[CMSG_SPACE(sizeof(int) * PIPES_PER_MESSAGE)];
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (count) {
		msg.msg_control = control.space;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
		struct cmsghdr *header = CMSG_FIRSTHDR(&msg);
		header->cmsg_level = SOL_SOCKET;
		header->cmsg_type = SCM_RIGHTS;
		header->cmsg_len = CMSG_LEN(sizeof(int) * count);
		memcpy(CMSG_DATA(header), fds, sizeof(int) * count);
	}
	return sendmsg(keeper, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof message ? 0 : -1;
}

/* Hands the keeper pipes holding a reference to every page of [vaddr, vaddr+size) (locked),
 * under `tag`: 0 (also with no keeper), or -1 with errno. */
static int keep_pages(uintptr_t vaddr, size_t size, uint64_t tag)
{
	if (keeper_socket() < 0)
		return 0;
	/* CAP_SYS_RESOURCE may size a pipe past pipe-max-size (1 MiB by default): else smaller ones. */
	static size_t pipe_bytes = PIPE_PAGES * PAGE;
	int pipes[PIPES_PER_MESSAGE];
	size_t count = 0;
	int status = 0;
	for (size_t at = 0; at < size && !status;) {
		int ends[2];
		if (pipe2(ends, O_CLOEXEC) < 0) {
			status = -1;
			break;
		}
		size_t chunk;
		for (;;) {
			chunk = size - at < pipe_bytes ? size - at : pipe_bytes;
			if (fcntl(ends[1], F_SETPIPE_SZ, (int)chunk) >= 0)
				break;
			if (errno != EPERM || pipe_bytes <= 16 * PAGE) {
				status = -1;
				break;
			}
			pipe_bytes /= 2;
		}
		struct iovec iov = { (void *)(vaddr + at), chunk };
		while (!status && iov.iov_len) {
			ssize_t spliced = vmsplice(ends[1], &iov, 1, SPLICE_F_NONBLOCK);
			if (spliced <= 0) {
				errno = spliced < 0 ? errno : EIO;
				status = -1;
				break;
			}
			iov.iov_base = (char *)iov.iov_base + spliced;
			iov.iov_len -= (size_t)spliced;
		}
		close(ends[1]);
		pipes[count++] = ends[0];
		at += chunk;
		if (count == PIPES_PER_MESSAGE || at >= size || status) {
			if (!status && keeper_send(PCI_KEEPER_KEEP, tag, 0, pipes, count) < 0)
				status = -1;
			while (count)
				close(pipes[--count]);
		}
	}
	if (status) {
		int error = errno;
		keeper_send(PCI_KEEPER_DROP, tag, 0, NULL, 0);
		errno = error;
	}
	return status;
}

/* Undoes a make that failed after its range was locked (and perhaps handed to the keeper). */
static int unmake(uintptr_t vaddr, size_t size, uint64_t tag)
{
	int error = errno;
	if (keeper >= 0)
		keeper_send(PCI_KEEPER_DROP, tag, 0, NULL, 0);
	munlock((void *)vaddr, size);
	errno = error;
	return -1;
}

/* Exports [vaddr, vaddr+size) under `name` (NULL: anonymous). */
static int pci_make(uint64_t vaddr, uint64_t size, int permit_type, uint64_t permit_value, const char *name,
		    xpmem_segid_t *segid)
{
	if (vaddr % PAGE || size % PAGE || size == 0 || vaddr + size < vaddr || vaddr + size > USER_LIMIT) {
		errno = EINVAL;
		return -1;
	}
	if (grow((void **)&exports, &export_capacity, export_count, sizeof *exports) < 0) {
		errno = ENOMEM;
		return -1;
	}
	/* Pinned so the frames the host maps stay this segment's (docs/xemem-pci.md says what else
	 * the guest must set so that compaction leaves them alone). */
	if (mlock((void *)(uintptr_t)vaddr, size) < 0) {
		/* mlock locks the mappings before a hole and then fails: undo that part. */
		int error = errno;
		munlock((void *)(uintptr_t)vaddr, size);
		errno = error;
		return -1;
	}
	/* Before MAKE: once the segment exists, its pages must not be freed before it goes. */
	uint64_t tag = ++next_tag, runs;
	if (keep_pages(vaddr, size, tag) < 0) {
		int error = errno;
		munlock((void *)(uintptr_t)vaddr, size);
		errno = error;
		return -1;
	}
	if (send_runs(vaddr, size, &runs) < 0 || (name && set_name(name) < 0))
		return unmake(vaddr, size, tag);
	if (!name)
		mailbox->name[0] = 0;
	uint64_t args[] = { vaddr, size, (uint64_t)permit_type, permit_value, runs, 0 };
	for (int i = 0; i < 6; i++)
		mailbox->args[i] = args[i];
	if (request(PCI_OP_MAKE) < 0)
		return unmake(vaddr, size, tag);
	*segid = (xpmem_segid_t)mailbox->results[0];
	exports[export_count++] = (struct pci_export){ *segid, vaddr, size, tag };
	/* Lost only if the keeper went: then it cannot remove the segment for us either. */
	if (keeper >= 0)
		keeper_send(PCI_KEEPER_MADE, tag, *segid, NULL, 0);
	return 0;
}

static int pci_remove(xpmem_segid_t segid)
{
	mailbox->args[0] = (uint64_t)segid;
	if (request(PCI_OP_REMOVE) < 0)
		return -1;
	for (size_t i = 0; i < export_count; i++) {
		if (exports[i].segid != segid)
			continue;
		munlock((void *)exports[i].vaddr, exports[i].size);
		if (keeper >= 0)
			keeper_send(PCI_KEEPER_DROP, exports[i].tag, 0, NULL, 0);
		exports[i] = exports[--export_count];
		break;
	}
	return 0;
}

/* Where this process sees `len` bytes of the window at `window_offset`: inside a kept extent, or
 * in a new one mapped over the placement's whole units; MAP_FAILED with errno. */
static void *window_address(uint64_t window_offset, size_t len)
{
	for (size_t i = 0; i < pci_extent_count; i++) {
		struct pci_extent e = pci_extents[i];
		if (window_offset >= e.window_offset && window_offset + len <= e.window_offset + e.len)
			return (char *)e.vaddr + (window_offset - e.window_offset);
	}
	if (grow((void **)&pci_extents, &pci_extent_capacity, pci_extent_count, sizeof *pci_extents) < 0) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	uint64_t start = window_offset & ~(PCI_PLACEMENT_UNIT - 1);
	uint64_t end = (window_offset + len + PCI_PLACEMENT_UNIT - 1) & ~(PCI_PLACEMENT_UNIT - 1);
	void *at = mmap(NULL, end - start, PROT_READ | PROT_WRITE, MAP_SHARED, window_fd, (off_t)(window_base + start));
	if (at == MAP_FAILED)
		return at;
	pci_extents[pci_extent_count++] = (struct pci_extent){ (uintptr_t)at, start, end - start };
	return (char *)at + (window_offset - start);
}

static int pci_attach(struct xpmem_cmd_attach *attach)
{
	uintptr_t fixed = attach->vaddr;
	if (attach->offset < 0 || attach->offset % PAGE || fixed % PAGE || attach->size == 0 ||
	    attach->size > USER_LIMIT || (fixed && fixed + attach->size > USER_LIMIT)) {
		errno = EINVAL;
		return -1;
	}
	if (grow((void **)&pci_attachments, &pci_attachment_capacity, pci_attachment_count,
		 sizeof *pci_attachments) < 0) {
		errno = ENOMEM;
		return -1;
	}
	size_t len = (attach->size + PAGE - 1) & ~(PAGE - 1);
	mailbox->args[0] = (uint64_t)attach->apid;
	mailbox->args[1] = (uint64_t)attach->offset;
	mailbox->args[2] = len;
	if (request(PCI_OP_ATTACH) < 0)
		return -1;
	uint64_t window_offset = mailbox->results[0];
	/* At the caller's address the attachment needs a mapping of its own. */
	void *at = mailbox->results[1] < len ? MAP_FAILED
		   : fixed ? mmap((void *)fixed, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, window_fd,
				  (off_t)(window_base + window_offset))
			   : window_address(window_offset, len);
	if (at == MAP_FAILED) {
		int error = mailbox->results[1] < len ? EIO : errno;
		mailbox->args[0] = window_offset;
		request(PCI_OP_DETACH);
		errno = error;
		return -1;
	}
	int slot = pci_board_note(window_offset, len);
	pci_attachments[pci_attachment_count++] = (struct pci_attachment){ (uintptr_t)at, len, window_offset, fixed != 0, slot };
	attach->vaddr = (uintptr_t)at;
	return 0;
}

/* As XPMEM: 0 also when nothing is attached at vaddr (a kept extent included), EINVAL when
 * something else is mapped there. */
static int pci_detach(uint64_t vaddr)
{
	for (size_t i = 0; i < pci_attachment_count; i++) {
		struct pci_attachment a = pci_attachments[i];
		if (vaddr < a.vaddr || vaddr >= a.vaddr + a.len)
			continue;
		if (a.own_mapping)
			munmap((void *)a.vaddr, a.len);
		pci_attachments[i] = pci_attachments[--pci_attachment_count];
		pci_board_clear(a.board_slot);
		mailbox->args[0] = a.window_offset;
		return request(PCI_OP_DETACH);
	}
	for (size_t i = 0; i < pci_extent_count; i++)
		if (vaddr >= pci_extents[i].vaddr && vaddr < pci_extents[i].vaddr + pci_extents[i].len)
			return 0;
	if (msync((void *)(uintptr_t)(vaddr & ~(PAGE - 1)), PAGE, MS_ASYNC) < 0 && errno == ENOMEM)
		return 0;
	errno = EINVAL;
	return -1;
}

/* XEMEM_CMD_NOTIFY_FD: an eventfd the keeper writes for each signal to this process's export
 * `segid` (the daemon forwards them to the agent); without a keeper, EOPNOTSUPP. */
static int pci_notify_fd(struct xemem_cmd_notify_fd *notify)
{
	size_t i = 0;
	while (i < export_count && exports[i].segid != notify->segid)
		i++;
	if (i == export_count) {
		errno = ENOENT;
		return -1;
	}
	if (keeper_socket() < 0) {
		errno = EOPNOTSUPP;
		return -1;
	}
	int fd = eventfd(0, notify->flags & (EFD_NONBLOCK | EFD_CLOEXEC));
	if (fd < 0)
		return -1;
	if (keeper_send(PCI_KEEPER_NOTIFY, exports[i].tag, notify->segid, &fd, 1) < 0) {
		int error = errno;
		close(fd);
		errno = error;
		return -1;
	}
	notify->fd = fd;
	return 0;
}

/* One XPMEM/XEMEM command, as device_call would issue it to /dev/xpmem. */
long pci_call(unsigned long command, void *argument)
{
	pthread_mutex_lock(&pci_lock);
	long result = -1;
	if (take_mailbox() < 0) {
		pthread_mutex_unlock(&pci_lock);
		return -1;
	}
	switch (command) {
	case XPMEM_CMD_VERSION:
		if (request(PCI_OP_HELLO) == 0)
			result = (long)mailbox->results[0];
		break;
	case XPMEM_CMD_MAKE: {
		struct xpmem_cmd_make *make = argument;
		result = pci_make(make->vaddr, make->size, make->permit_type, make->permit_value, NULL, &make->segid);
		break;
	}
	case XEMEM_CMD_MAKE_NAMED: {
		struct xemem_cmd_make_named *named = argument;
		result = pci_make(named->vaddr, named->size, XPMEM_PERMIT_MODE, 0666, named->name, &named->segid);
		break;
	}
	case XPMEM_CMD_REMOVE:
		result = pci_remove(*(xpmem_segid_t *)argument);
		break;
	case XPMEM_CMD_GET: {
		struct xpmem_cmd_get *get = argument;
		mailbox->args[0] = (uint64_t)get->segid;
		mailbox->args[1] = (uint64_t)get->flags;
		mailbox->args[2] = (uint64_t)get->permit_type;
		if ((result = request(PCI_OP_GET)) == 0)
			get->apid = (xpmem_apid_t)mailbox->results[0];
		break;
	}
	case XPMEM_CMD_RELEASE:
	case XEMEM_CMD_SIGNAL:
		mailbox->args[0] = (uint64_t) * (xpmem_apid_t *)argument;
		result = request(command == XPMEM_CMD_RELEASE ? PCI_OP_RELEASE : PCI_OP_SIGNAL);
		break;
	case XPMEM_CMD_ATTACH:
		result = pci_attach(argument);
		break;
	case XPMEM_CMD_DETACH:
		result = pci_detach(*(uint64_t *)argument);
		break;
	case XEMEM_CMD_LOOKUP: {
		struct xemem_cmd_lookup *lookup = argument;
		if ((result = set_name(lookup->name)) == 0 && (result = request(PCI_OP_LOOKUP)) == 0)
			lookup->segid = (xpmem_segid_t)mailbox->results[0];
		break;
	}
	case XEMEM_CMD_NOTIFY_FD:
		result = pci_notify_fd(argument);
		break;
	default:
		/* The fork hooks need a guest kernel's help. */
		errno = EOPNOTSUPP;
	}
	int error = errno;
	give_mailbox_back();
	errno = error;
	pthread_mutex_unlock(&pci_lock);
	return result;
}
