/*
 * libxpmem's Linux-VM backend (src/backend_pci.c) against a fake XEMEM PCI device: a sysfs-like
 * tree (CLOWDER_XEMEM_PCI_SYSFS) whose resource0 and resource2 are memfds standing in for the
 * mailbox and window BARs (the window's memfd also stands in for /dev/mem, with the window at
 * FAKE_BASE as the tree's `resource` file says, unless a case lays it out for sysfs alone),
 * and a thread playing the host: it answers the mailbox, records the
 * runs an export names, and "places" segments in the window by writing a pattern there.
 * Each case runs in its own process: `pci_fake --list`, `pci_fake CASE`. Exit 0 on success.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xpmem.h>

/* The device's ids and the mailbox's layout, as src/backend_pci.c sees them. */
#include "../src/pci_mailbox.h"

#define PAGE 4096UL
#define WINDOW_SIZE (64UL << 20)
#define FAKE_BASE (1UL << 30) /* the window BAR's guest-physical address (a sparse memfd offset) */
#define PLACE_ALIGN (2UL << 20)
#define HOST_SEGID 77 /* a segment the fake host owns, named "host-seg" */
#define APID_BASE 1000

#define CHECK(cond)                                                                                  \
	do {                                                                                         \
		if (!(cond)) {                                                                       \
			fprintf(stderr, "%s:%d: check failed: %s (errno %s)\n", __FILE__, __LINE__, #cond, \
				strerror(errno));                                                    \
			exit(1);                                                                     \
		}                                                                                    \
	} while (0)

static struct pci_mailbox *box;
static char *window;
static atomic_int stop;
/* What the host saw. */
static struct pci_run *received;
static size_t received_count, run_requests, detaches, removes;
static uint64_t made_size;
static char made_name[64];
static int placed[WINDOW_SIZE / PLACE_ALIGN];
/* Set by a case before fake_device: the window at offset 0 of its memfd (resource2's view)
 * rather than at FAKE_BASE (/dev/mem's), so only a mapping through resource2 reads it right. */
static int window_at_zero;

static int answer(uint32_t op)
{
	uint64_t *a = box->args;
	switch (op) {
	case PCI_OP_HELLO:
		box->results[0] = 1;
		return 0;
	case PCI_OP_RUNS:
		if (a[0] == 0) /* a new export */
			received_count = 0;
		if (a[0] != received_count)
			return EINVAL;
		received = realloc(received, (received_count + box->nruns) * sizeof *received);
		memcpy(received + received_count, box->runs, box->nruns * sizeof *received);
		received_count += box->nruns;
		run_requests++;
		return 0;
	case PCI_OP_MAKE: {
		uint64_t sum = 0;
		for (size_t i = 0; i < received_count; i++)
			sum += received[i].len;
		if (a[4] != received_count || sum != a[1])
			return EINVAL;
		made_size = a[1];
		memcpy(made_name, box->name, sizeof made_name);
		box->results[0] = 500;
		return 0;
	}
	case PCI_OP_REMOVE:
		if (a[0] != 500 || removes)
			return ENOENT;
		removes++;
		return 0;
	case PCI_OP_GET:
		if (a[0] != HOST_SEGID && a[0] != 500)
			return ENOENT;
		box->results[0] = APID_BASE + a[0];
		return 0;
	case PCI_OP_RELEASE:
	case PCI_OP_SIGNAL:
		return a[0] > APID_BASE ? 0 : ENOENT;
	case PCI_OP_ATTACH: { /* apid, offset in the segment, length */
		if (a[0] != APID_BASE + HOST_SEGID)
			return ENOENT;
		uint64_t slots = (a[2] + PLACE_ALIGN - 1) / PLACE_ALIGN;
		for (uint64_t first = 0; first + slots <= WINDOW_SIZE / PLACE_ALIGN; first++) {
			uint64_t n = 0;
			while (n < slots && !placed[first + n])
				n++;
			if (n < slots)
				continue;
			for (n = 0; n < slots; n++)
				placed[first + n] = n == 0 ? 1 : 2;
			for (uint64_t page = 0; page < a[2] / PAGE; page++)
				*(uint64_t *)(window + first * PLACE_ALIGN + page * PAGE) = a[1] / PAGE + page + 1;
			box->results[0] = first * PLACE_ALIGN;
			box->results[1] = a[2];
			return 0;
		}
		return ENOSPC;
	}
	case PCI_OP_DETACH: {
		uint64_t first = a[0] / PLACE_ALIGN;
		if (a[0] % PLACE_ALIGN || first >= WINDOW_SIZE / PLACE_ALIGN || placed[first] != 1)
			return EINVAL;
		/* A detached placement reads all ones, as the VMM's WindowHoles answers there. */
		for (uint64_t n = first; n < WINDOW_SIZE / PLACE_ALIGN && placed[n] && (n == first || placed[n] == 2); n++) {
			placed[n] = 0;
			memset(window + n * PLACE_ALIGN, 0xff, PLACE_ALIGN);
		}
		detaches++;
		return 0;
	}
	case PCI_OP_LOOKUP:
		if (strncmp(box->name, "host-seg", sizeof box->name))
			return ENOENT;
		box->results[0] = HOST_SEGID;
		return 0;
	}
	return ENOSYS;
}

static void *host(void *unused)
{
	(void)unused;
	uint32_t seen = 0;
	while (!atomic_load(&stop)) {
		uint32_t bell = __atomic_load_n(&box->doorbell, __ATOMIC_ACQUIRE);
		if (bell == seen) {
			sched_yield();
			continue;
		}
		box->error = answer(box->op);
		seen = bell;
		__atomic_store_n(&box->done, bell, __ATOMIC_RELEASE);
	}
	return NULL;
}

static char tree[32];

/* Removes the fake tree (two directories of files and symlinks, and the mailbox's user word
 * and the attachment board beside them). */
static void remove_tree(void)
{
	const char *beside[] = { "lock", "board" };
	const char *dirs[] = { "0000:00:00.0", "0000:00:01.0" };
	const char *files[] = { "vendor", "device", "resource", "resource0", "resource2" };
	char path[128];
	for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
		for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
			snprintf(path, sizeof path, "%s/%s/%s", tree, dirs[d], files[f]);
			unlink(path);
		}
		snprintf(path, sizeof path, "%s/%s", tree, dirs[d]);
		rmdir(path);
	}
	for (size_t f = 0; f < sizeof beside / sizeof *beside; f++) {
		snprintf(path, sizeof path, "%s/%s", tree, beside[f]);
		unlink(path);
	}
	rmdir(tree);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* The fake tree: a decoy device and the XEMEM device whose resources are memfds. */
static void fake_device(int magic, int answering)
{
	char path[256], target[64];
	char *root = strcpy(tree, "/tmp/xemem-pci-XXXXXX");
	CHECK(mkdtemp(root) && atexit(remove_tree) == 0);
	snprintf(path, sizeof path, "%s/0000:00:00.0", root);
	CHECK(mkdir(path, 0755) == 0);
	snprintf(path, sizeof path, "%s/0000:00:00.0/vendor", root);
	write_file(path, "0x8086\n");
	snprintf(path, sizeof path, "%s/0000:00:00.0/device", root);
	write_file(path, "0x0001\n");
	snprintf(path, sizeof path, "%s/0000:00:01.0", root);
	CHECK(mkdir(path, 0755) == 0);
	char id[16];
	snprintf(path, sizeof path, "%s/0000:00:01.0/vendor", root);
	snprintf(id, sizeof id, "%#06x\n", PCI_VENDOR);
	write_file(path, id);
	snprintf(path, sizeof path, "%s/0000:00:01.0/device", root);
	snprintf(id, sizeof id, "%#06x\n", PCI_DEVICE);
	write_file(path, id);
	/* As a guest kernel prints it: start, end, flags of resources 0 (the mailbox), 1, 2 (the window). */
	snprintf(path, sizeof path, "%s/0000:00:01.0/resource", root);
	snprintf(target, sizeof target, "0x%016lx 0x%016lx 0x%016x\n", 0xfe000000UL, 0xfe000000UL + PCI_MAILBOX_SIZE - 1, 0x40200);
	char text[256];
	snprintf(text, sizeof text, "%s0x%016x 0x%016x 0x%016x\n0x%016lx 0x%016lx 0x%016x\n", target, 0, 0, 0, FAKE_BASE,
		 FAKE_BASE + WINDOW_SIZE - 1, 0x14220c);
	write_file(path, text);
	uint64_t base = window_at_zero ? 0 : FAKE_BASE;
	int mailbox_fd = memfd_create("mailbox", 0), window_fd = memfd_create("window", 0);
	CHECK(mailbox_fd >= 0 && window_fd >= 0 && ftruncate(mailbox_fd, PCI_MAILBOX_SIZE) == 0 &&
	      ftruncate(window_fd, (off_t)(base + WINDOW_SIZE)) == 0);
	box = mmap(NULL, PCI_MAILBOX_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, mailbox_fd, 0);
	window = mmap(NULL, WINDOW_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, window_fd, (off_t)base);
	CHECK(box != MAP_FAILED && window != MAP_FAILED);
	box->magic = magic ? PCI_MAGIC : 0;
	box->version = PCI_VERSION;
	snprintf(target, sizeof target, "/proc/%d/fd/%d", getpid(), mailbox_fd);
	snprintf(path, sizeof path, "%s/0000:00:01.0/resource0", root);
	CHECK(symlink(target, path) == 0);
	snprintf(target, sizeof target, "/proc/%d/fd/%d", getpid(), window_fd);
	snprintf(path, sizeof path, "%s/0000:00:01.0/resource2", root);
	CHECK(symlink(target, path) == 0);
	setenv("CLOWDER_XEMEM_PCI_MEM", target, 1);
	setenv("CLOWDER_XEMEM_PCI_SYSFS", root, 1);
	setenv("CLOWDER_XEMEM_BACKEND", "pci", 1);
	/* The mailbox's user word beside the tree, not the host's /run. */
	snprintf(path, sizeof path, "%s/lock", root);
	setenv("CLOWDER_XEMEM_PCI_LOCK", path, 1);
	snprintf(path, sizeof path, "%s/board", root);
	setenv("CLOWDER_XEMEM_PCI_BOARD", path, 1);
	/* A broker must never be what answers. */
	setenv("CLOWDER_XEMEM_SOCKET", "/nonexistent/xemem.sock", 1);
	pthread_t thread;
	if (answering)
		CHECK(pthread_create(&thread, NULL, host, NULL) == 0);
}

static uint64_t frame_of(const void *addr)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);
	uint64_t entry = 0;
	CHECK(fd >= 0 && pread(fd, &entry, 8, (off_t)((uintptr_t)addr / PAGE * 8)) == 8);
	close(fd);
	return entry & ((1ULL << 55) - 1);
}

static long locked_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmLck: %ld", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static void case_discovery(void)
{
	fake_device(1, 1);
	CHECK(xpmem_init() == 0);
	CHECK(xpmem_version() == 1);
	CHECK(box->doorbell == box->done && box->done >= 1);
}

static void case_no_device(void)
{
	fake_device(1, 1);
	setenv("CLOWDER_XEMEM_PCI_SYSFS", "/nonexistent", 1);
	errno = 0;
	CHECK(xpmem_init() == -1 && errno == ENODEV);
	CHECK(xpmem_make(box, PAGE, XPMEM_PERMIT_MODE, (void *)0600) == -1 && errno == ENODEV);
}

static void case_bad_magic(void)
{
	fake_device(0, 1);
	CHECK(xpmem_init() == -1 && errno == ENODEV);
}

static void case_export(void)
{
	fake_device(1, 1);
	size_t size = 32UL << 20, pages = size / PAGE;
	char *buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED && madvise(buf, size, MADV_NOHUGEPAGE) == 0);
	/* Touched in a scattered order, so the frames are far from one contiguous run. */
	for (size_t i = 0; i < pages; i++)
		buf[(i * 7919) % pages * PAGE] = 1;
	long locked_before = locked_kib();
	xpmem_segid_t segid = xemem_make(buf, size, "guest-seg");
	CHECK(segid == 500);
	CHECK(made_size == size && !strcmp(made_name, "guest-seg"));
	CHECK(locked_kib() - locked_before == (long)(size >> 10));
	/* Every page, in order, is the frame pagemap names for it. */
	size_t page = 0;
	for (size_t r = 0; r < received_count; r++) {
		CHECK(received[r].len % PAGE == 0 && received[r].len > 0);
		for (uint64_t off = 0; off < received[r].len; off += PAGE, page++)
			CHECK((received[r].gpa + off) / PAGE == frame_of(buf + page * PAGE));
	}
	CHECK(page == pages);
	printf("%zu runs in %zu requests\n", received_count, run_requests);
	CHECK(received_count <= 4080 || run_requests > 1);
	CHECK(xpmem_remove(segid) == 0 && removes == 1);
	CHECK(locked_kib() == locked_before);
	CHECK(xpmem_remove(segid) == -1 && errno == ENOENT);
	/* Unaligned, empty and unmapped ranges are refused, and nothing stays locked. */
	CHECK(xpmem_make(buf + 1, PAGE, XPMEM_PERMIT_MODE, (void *)0600) == -1 && errno == EINVAL);
	CHECK(xpmem_make(buf, 0, XPMEM_PERMIT_MODE, (void *)0600) == -1 && errno == EINVAL);
	CHECK(munmap(buf + PAGE, PAGE) == 0);
	CHECK(xpmem_make(buf, 2 * PAGE, XPMEM_PERMIT_MODE, (void *)0600) == -1 && errno == ENOMEM);
	CHECK(locked_kib() == locked_before);
}

static void case_attach(void)
{
	fake_device(1, 1);
	xpmem_segid_t segid = xemem_lookup_segid("host-seg");
	CHECK(segid == HOST_SEGID);
	CHECK(xemem_lookup_segid("nobody") == -1 && errno == ENOENT);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid == APID_BASE + HOST_SEGID);
	CHECK(xpmem_get(12345, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) == -1 && errno == ENOENT);
	struct xpmem_addr addr = { .apid = apid, .offset = 4 * PAGE };
	uint64_t *first = xpmem_attach(addr, 3 << 20, NULL);
	CHECK(first != (void *)-1);
	/* The host's pattern: each page's first word is its page number in the segment + 1. */
	for (size_t page = 0; page < (3 << 20) / PAGE; page++)
		CHECK(first[page * PAGE / 8] == 4 + page + 1);
	uint64_t *second = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGE, NULL);
	CHECK(second != (void *)-1 && second[0] == 1);
	/* A store through the attachment lands in the window (the host's memory). */
	first[1] = 0xfeed;
	CHECK(*(uint64_t *)(window + 8) == 0xfeed);
	CHECK(placed[0] == 1 && placed[1] == 2 && placed[2] == 1);
	CHECK(xpmem_detach((char *)first + 5 * PAGE) == 0 && detaches == 1 && placed[0] == 0);
	CHECK(xpmem_detach(second) == 0 && detaches == 2 && placed[2] == 0);
	CHECK(xpmem_detach(second) == 0 && detaches == 2);
	int local = 0;
	CHECK(xpmem_detach(&local) == -1 && errno == EINVAL);
	/* Bad arguments and permits the host does not know. */
	CHECK(xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 1 }, PAGE, NULL) == (void *)-1 && errno == EINVAL);
	CHECK(xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, 0, NULL) == (void *)-1 && errno == EINVAL);
	CHECK(xpmem_attach((struct xpmem_addr){ .apid = 5, .offset = 0 }, PAGE, NULL) == (void *)-1 && errno == ENOENT);
	CHECK(xpmem_attach(addr, WINDOW_SIZE + PAGE, NULL) == (void *)-1 && errno == ENOSPC);
	CHECK(xemem_signal(apid) == 0);
	CHECK(xpmem_release(apid) == 0);
	/* Not a segment of this process (and no keeper to hand a descriptor to in any case). */
	CHECK(xemem_notify_fd(HOST_SEGID) == -1 && errno == ENOENT);
}

/* Mappings of the fake window in this process (the fake host's own included). */
static int window_mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int count = 0;
	while (f && fgets(line, sizeof line, f))
		count += strstr(line, "memfd:window") != NULL;
	if (f)
		fclose(f);
	return count;
}

/* The window's mappings are kept: an attachment placed where an earlier one was reuses its
 * mapping (no guest kernel work per attach on a VM), the detached part reads what the window
 * holds there (all ones), and an attachment at the caller's address has a mapping of its own
 * that goes with it. */
static void case_window_kept(void)
{
	fake_device(1, 1);
	xpmem_apid_t apid = xpmem_get(HOST_SEGID, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid == APID_BASE + HOST_SEGID);
	int before = window_mappings();
	uint64_t *a = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, 3 << 20, NULL);
	CHECK(a != (void *)-1 && a[0] == 1 && a[PAGE / 8] == 2 && window_mappings() == before + 1);
	CHECK(xpmem_detach(a) == 0 && detaches == 1 && placed[0] == 0);
	CHECK(a[0] == ~0ULL && a[((3 << 20) - 8) / 8] == ~0ULL);
	CHECK(xpmem_detach(a) == 0 && detaches == 1);
	/* Placed at the same units again, from another offset: the same mapping shows it. */
	uint64_t *b = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 8 * PAGE }, 4 << 20, NULL);
	CHECK(b == a && b[0] == 9 && b[(4 << 20) / 8 - PAGE / 8] == 8 + 1024 && window_mappings() == before + 1);
	/* Beside it, a new placement is a new mapping. */
	uint64_t *c = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGE, NULL);
	CHECK(c != (void *)-1 && c != b && c[0] == 1 && placed[2] == 1 && window_mappings() == before + 2);
	/* At the caller's address: a mapping of its own, unmapped at the detach. */
	char *want = mmap(NULL, 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(want != MAP_FAILED);
	uint64_t *d = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = PAGE }, PAGE, want + PAGE);
	CHECK((char *)d == want + PAGE && d[0] == 2 && window_mappings() == before + 3);
	CHECK(xpmem_detach(d) == 0 && window_mappings() == before + 2);
	CHECK(msync(d, PAGE, MS_ASYNC) == -1 && errno == ENOMEM);
	CHECK(xpmem_detach(b) == 0 && xpmem_detach(c) == 0 && detaches == 4);
	int local = 0;
	CHECK(xpmem_detach(&local) == -1 && errno == EINVAL);
}

/* The first attach of the host's segment reads its pattern; what libxpmem said on stderr while
 * it found the device is left in `said`. */
static void attach_reads_the_pattern(char *said, size_t size)
{
	int saved = dup(2), log = memfd_create("stderr", 0);
	CHECK(saved >= 0 && log >= 0 && dup2(log, 2) == 2);
	int version = xpmem_version();
	CHECK(dup2(saved, 2) == 2 && version == 1);
	ssize_t got = pread(log, said, size - 1, 0);
	said[got > 0 ? got : 0] = 0;
	xpmem_apid_t apid = xpmem_get(HOST_SEGID, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	uint64_t *a = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, 4 << 20, NULL);
	CHECK(a != (void *)-1);
	for (size_t page = 0; page < (4 << 20) / PAGE; page++)
		CHECK(a[page * PAGE / 8] == page + 1);
	a[1] = 0xfeed;
	CHECK(*(uint64_t *)(window + 8) == 0xfeed && xpmem_detach(a) == 0);
}

/* By default the window is mapped through /dev/mem at the BAR's address (write-back on a guest;
 * here the fake's window sits only there), and nothing is said. */
static void case_window_mem(void)
{
	fake_device(1, 1);
	char said[512];
	attach_reads_the_pattern(said, sizeof said);
	CHECK(said[0] == 0);
}

/* With CLOWDER_XEMEM_PCI_MAP=`map`, an attach reads the pattern, saying nothing. */
static void attach_quietly_with_map(const char *map)
{
	setenv("CLOWDER_XEMEM_PCI_MAP", map, 1);
	char said[512];
	attach_reads_the_pattern(said, sizeof said);
	CHECK(said[0] == 0);
}

/* CLOWDER_XEMEM_PCI_MAP=sysfs maps resource2 (the window at its offset 0). */
static void case_window_sysfs(void)
{
	window_at_zero = 1;
	fake_device(1, 1);
	attach_quietly_with_map("sysfs");
}

/* CLOWDER_XEMEM_PCI_MAP=devmem names the default. */
static void case_window_devmem(void)
{
	fake_device(1, 1);
	attach_quietly_with_map("devmem");
}

/* Any other value is refused in one line naming the variable and its values, and the device is
 * not used (rather than mapped some way the user did not ask for). */
static void case_window_typo(void)
{
	fake_device(1, 1);
	setenv("CLOWDER_XEMEM_PCI_MAP", "sysf", 1);
	int saved = dup(2), log = memfd_create("stderr", 0);
	CHECK(saved >= 0 && log >= 0 && dup2(log, 2) == 2);
	errno = 0;
	int version = xpmem_version();
	int error = errno;
	CHECK(dup2(saved, 2) == 2);
	char said[512];
	ssize_t got = pread(log, said, sizeof said - 1, 0);
	said[got > 0 ? got : 0] = 0;
	CHECK(version == -1 && error == ENODEV);
	CHECK(!strcmp(said, "libxpmem: CLOWDER_XEMEM_PCI_MAP must be 'devmem' or 'sysfs', not 'sysf'; the XEMEM PCI "
			    "device is not used\n"));
	CHECK(box->doorbell == 0);
}

/* Without /dev/mem, resource2 again, with the reason on stderr. */
static void case_window_fallback(void)
{
	window_at_zero = 1;
	fake_device(1, 1);
	setenv("CLOWDER_XEMEM_PCI_MEM", "/nonexistent/mem", 1);
	char said[512];
	attach_reads_the_pattern(said, sizeof said);
	CHECK(strstr(said, "libxpmem: /nonexistent/mem: No such file or directory: the XEMEM window is mapped "
			   "through resource2, uncached\n"));
}

static void case_host_gone(void)
{
	fake_device(1, 0);
	setenv("CLOWDER_XEMEM_PCI_TIMEOUT_MS", "200", 1);
	CHECK(xpmem_version() == -1 && errno == ETIMEDOUT);
	CHECK(xemem_lookup_segid("host-seg") == -1 && errno == ETIMEDOUT);
}

/* The agent's keeper as the library sees it: a listening abstract SEQPACKET socket. */
static int fake_keeper(void)
{
	char name[64];
	snprintf(name, sizeof name, "pci-fake-keeper-%d", getpid());
	setenv("CLOWDER_XEMEM_KEEPER", name, 1);
	struct sockaddr_un address = { .sun_family = AF_UNIX };
	memcpy(address.sun_path + 1, name, strlen(name));
	int listener = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	CHECK(listener >= 0 &&
	      bind(listener, (struct sockaddr *)&address, offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name)) == 0 &&
	      listen(listener, 1) == 0);
	return listener;
}

/* A keeper message as the fake keeper reads it (pci_mailbox.h's layout: op, then two words). */
struct keeper_message {
	uint32_t op, reserved;
	uint64_t a;
	int64_t b;
};

/* Room for the descriptors one keeper message may carry (at most 253). */
union keeper_control {
	struct cmsghdr header;
	char space[CMSG_SPACE(sizeof(int) * 253)];
};

/* Receives one keeper message; *header is its first control message (NULL if none). */
static ssize_t keeper_recvmsg(int connection, struct keeper_message *message, union keeper_control *control,
			      struct cmsghdr **header)
{
	struct iovec iov = { message, sizeof *message };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control->space,
			      .msg_controllen = sizeof control->space };
	ssize_t got = recvmsg(connection, &msg, 0);
	*header = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
	return got;
}

/* A process that exports and ends without removing: its pages reach the keeper, held by pipes
 * that still hold what it wrote after it is gone (the guest kernel cannot reuse them), with the
 * segment's id to remove; an export it removed itself is dropped. */
static void case_keeper(void)
{
	fake_device(1, 1);
	int listener = fake_keeper();
	size_t size = 80UL << 20, pages = size / PAGE; /* two pipes' worth at least */
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		char *buf = mmap(NULL, size + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(buf != MAP_FAILED);
		for (size_t i = 0; i < pages; i++)
			*(uint64_t *)(buf + i * PAGE) = 0x6b656570ULL << 32 | i;
		xpmem_segid_t removed = xpmem_make(buf + size, PAGE, XPMEM_PERMIT_MODE, (void *)0600);
		CHECK(removed == 500 && xpmem_remove(removed) == 0);
		CHECK(xemem_make(buf, size, "guest-seg") == 500);
		_exit(0); /* without xpmem_remove */
	}
	struct pollfd ready = { .fd = listener, .events = POLLIN };
	CHECK(poll(&ready, 1, 20000) == 1);
	int connection = accept(listener, NULL, NULL);
	CHECK(connection >= 0);
	int pipes[2][256], made[2] = { 0, 0 }, dropped[2] = { 0, 0 };
	size_t npipes[2] = { 0, 0 };
	for (;;) {
		struct keeper_message message;
		union keeper_control control;
		struct cmsghdr *header;
		ssize_t got = keeper_recvmsg(connection, &message, &control, &header);
		if (got == 0)
			break;
		CHECK(got == sizeof message && message.a >= 1 && message.a <= 2);
		int t = (int)message.a - 1;
		if (message.op == 1) {
			CHECK(header && header->cmsg_type == SCM_RIGHTS);
			size_t n = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			CHECK(npipes[t] + n <= 256);
			memcpy(pipes[t] + npipes[t], CMSG_DATA(header), n * sizeof(int));
			npipes[t] += n;
		} else {
			CHECK(!header && (message.op == 2 ? message.b == 500 : message.op == 3));
			(message.op == 2 ? made : dropped)[t]++;
		}
	}
	int status;
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(npipes[0] == 1 && made[0] == 1 && dropped[0] == 1);
	CHECK(npipes[1] >= 2 && made[1] == 1 && dropped[1] == 0);
	/* The ended process's pages, in order, as it left them. */
	char *page = malloc(PAGE);
	size_t seen = 0;
	for (size_t p = 0; p < npipes[1]; p++) {
		ssize_t got;
		while ((got = read(pipes[1][p], page, PAGE)) == (ssize_t)PAGE) {
			CHECK(*(uint64_t *)page == (0x6b656570ULL << 32 | seen));
			seen++;
		}
		CHECK(got == 0 || got == -1);
		close(pipes[1][p]);
	}
	printf("%zu pages held after the exporter ended\n", seen);
	CHECK(seen == pages);
}

/* One keeper message (the layout of pci_mailbox.h), with its descriptor if it carried one. */
static void keeper_receive(int connection, uint32_t op, uint64_t *a, int64_t *b, int *fd)
{
	struct keeper_message message;
	union keeper_control control;
	struct cmsghdr *header;
	CHECK(keeper_recvmsg(connection, &message, &control, &header) == PCI_KEEPER_MESSAGE && message.op == op);
	CHECK(!header == !fd);
	if (fd) {
		CHECK(header->cmsg_type == SCM_RIGHTS && header->cmsg_len == CMSG_LEN(sizeof(int)));
		memcpy(fd, CMSG_DATA(header), sizeof(int));
	}
	*a = message.a;
	*b = message.b;
}

/* A process's start time, field 22 of /proc/PID/stat, as the library notes it. */
static uint64_t start_of(pid_t pid)
{
	char path[64], stat[1024] = "";
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	CHECK(f && fgets(stat, sizeof stat, f));
	fclose(f);
	char *at = strrchr(stat, ')');
	for (int field = 2; at && field < 22; field++)
		at = strchr(at + 1, ' ');
	CHECK(at);
	return strtoull(at + 1, NULL, 10);
}

/* The attachment board's slots of this process (the agent's view of who attached what): how
 * many, and the window offset and length of the one at `offset` in *len (0: none there). */
static size_t board_entries(uint64_t offset, uint64_t *len)
{
	char path[256];
	snprintf(path, sizeof path, "%s/board", tree);
	int fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	struct pci_board_slot *slots = mmap(NULL, PCI_BOARD_SLOTS * PCI_BOARD_SLOT_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(slots != MAP_FAILED);
	close(fd);
	uint64_t start = start_of(getpid());
	size_t count = 0;
	*len = 0;
	for (size_t i = 0; i < PCI_BOARD_SLOTS; i++) {
		if (atomic_load(&slots[i].pid) != (uint32_t)getpid())
			continue;
		CHECK(atomic_load(&slots[i].generation) % 2 == 0 && slots[i].start == start);
		count++;
		if (slots[i].window_offset == offset)
			*len = slots[i].len;
	}
	munmap(slots, PCI_BOARD_SLOTS * PCI_BOARD_SLOT_SIZE);
	return count;
}

/* What the agent needs to deliver SIGBUS and signals: each attachment's window offset and
 * length on the board (gone after its detach), and an owner's notify descriptor as an eventfd
 * the keeper writes. */
static void case_keeper_events(void)
{
	fake_device(1, 1);
	int listener = fake_keeper();
	char *buf = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED);
	buf[0] = 1;
	xpmem_segid_t segid = xpmem_make(buf, PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid == 500);
	int connection = accept(listener, NULL, NULL);
	CHECK(connection >= 0);
	uint64_t a, tag;
	int64_t b;
	int keep;
	keeper_receive(connection, PCI_KEEPER_KEEP, &tag, &b, &keep);
	close(keep);
	keeper_receive(connection, PCI_KEEPER_MADE, &a, &b, NULL);
	CHECK(a == tag && b == 500);
	/* The owner's descriptor: the keeper's copy written once per signal. */
	int fd = xemem_notify_fd(segid), theirs;
	CHECK(fd >= 0 && xemem_notify_fd(segid) == fd);
	keeper_receive(connection, PCI_KEEPER_NOTIFY, &a, &b, &theirs);
	CHECK(a == tag && b == 500);
	uint64_t one = 1, count = 0;
	CHECK(read(fd, &count, sizeof count) == -1 && errno == EAGAIN);
	CHECK(write(theirs, &one, sizeof one) == sizeof one && write(theirs, &one, sizeof one) == sizeof one);
	CHECK(read(fd, &count, sizeof count) == sizeof count && count == 2);
	CHECK(xemem_notify_fd(12345) == -1 && errno == ENOENT);
	/* Attach and detach: each placement's window offset and length on the board, with this
	 * process's pid and start time, and no keeper message; gone after the detach. */
	xpmem_apid_t apid = xpmem_get(HOST_SEGID, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid > 0);
	CHECK(xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGE, NULL) != (void *)-1);
	uint64_t *second = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, 3 * PAGE, NULL);
	CHECK(second != (void *)-1);
	uint64_t len;
	CHECK(board_entries(0, &len) == 2 && len == PAGE);
	CHECK(board_entries(PLACE_ALIGN, &len) == 2 && len == 3 * PAGE);
	CHECK(xpmem_detach(second) == 0);
	CHECK(board_entries(PLACE_ALIGN, &len) == 1 && len == 0);
	CHECK(xpmem_remove(segid) == 0);
	/* The next message after NOTIFY is the removal's: nothing was sent for the attachments. */
	keeper_receive(connection, PCI_KEEPER_DROP, &a, &b, NULL);
	CHECK(a == tag);
	printf("the keeper heard the notify descriptor; the board showed both attachments and the detach\n");
}

/* Slots left by processes that ended without detaching (or whose pid another process took
 * over) are freed when the board is full; a live process's slot stays. */
static void case_board_full(void)
{
	fake_device(1, 1);
	char path[256];
	snprintf(path, sizeof path, "%s/board", tree);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	CHECK(fd >= 0 && ftruncate(fd, PCI_BOARD_SLOTS * PCI_BOARD_SLOT_SIZE) == 0);
	struct pci_board_slot *slots = mmap(NULL, PCI_BOARD_SLOTS * PCI_BOARD_SLOT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(slots != MAP_FAILED);
	close(fd);
	/* Every slot held: all but one by a process that is gone (its start time cannot match). */
	pid_t gone = fork();
	CHECK(gone >= 0);
	if (gone == 0)
		_exit(0);
	CHECK(waitpid(gone, NULL, 0) == gone);
	for (size_t i = 0; i < PCI_BOARD_SLOTS; i++) {
		atomic_store(&slots[i].pid, (uint32_t)(i == 7 ? getppid() : i == 9 ? getppid() : gone));
		slots[i].start = i == 7 ? start_of(getppid()) : 12345;
		slots[i].window_offset = 64UL << 30;
		slots[i].len = PAGE;
	}
	xpmem_apid_t apid = xpmem_get(HOST_SEGID, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid > 0);
	void *at = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGE, NULL);
	CHECK(at != (void *)-1);
	uint64_t len;
	CHECK(board_entries(0, &len) == 1 && len == PAGE);
	size_t left = 0;
	for (size_t i = 0; i < PCI_BOARD_SLOTS; i++)
		left += atomic_load(&slots[i].pid) == (uint32_t)gone;
	/* Slot 7 is the live parent's; slot 9 names the parent's pid with another start time. */
	printf("%zu dead processes' slots freed; the live parent's slot %s, the taken-over pid's %s\n",
	       (size_t)PCI_BOARD_SLOTS - 2 - left, atomic_load(&slots[7].pid) ? "kept" : "freed",
	       atomic_load(&slots[9].pid) == (uint32_t)getpid() ? "reused" : atomic_load(&slots[9].pid) ? "kept" : "freed");
	CHECK(left == 0 && atomic_load(&slots[7].pid) == (uint32_t)getppid() && atomic_load(&slots[9].pid) != (uint32_t)getppid());
	CHECK(xpmem_detach(at) == 0 && board_entries(0, &len) == 0);
}

/* No board (a path that cannot be made): attaches and detaches still work. */
static void case_board_absent(void)
{
	fake_device(1, 1);
	setenv("CLOWDER_XEMEM_PCI_BOARD", "/nonexistent/board", 1);
	xpmem_apid_t apid = xpmem_get(HOST_SEGID, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid > 0);
	for (int i = 0; i < 3; i++) {
		char *at = xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGE, NULL);
		CHECK(at != (void *)-1 && xpmem_detach(at) == 0);
	}
	printf("attached and detached without a board\n");
}

static const struct {
	const char *name;
	void (*run)(void);
} cases[] = {
	{ "discovery", case_discovery }, { "no_device", case_no_device }, { "bad_magic", case_bad_magic },
	{ "export", case_export },       { "attach", case_attach },       { "host_gone", case_host_gone },
	{ "keeper", case_keeper },       { "keeper_events", case_keeper_events },
	{ "board_full", case_board_full }, { "board_absent", case_board_absent },
	{ "window_kept", case_window_kept }, { "window_mem", case_window_mem },
	{ "window_sysfs", case_window_sysfs }, { "window_fallback", case_window_fallback },
	{ "window_devmem", case_window_devmem }, { "window_typo", case_window_typo },
};

int main(int argc, char **argv)
{
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		if (argc == 2 && !strcmp(argv[1], "--list"))
			puts(cases[i].name);
		else if (argc == 2 && !strcmp(argv[1], cases[i].name))
			cases[i].run();
		else
			continue;
		if (strcmp(argv[1], "--list"))
			return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--list"))
		return 0;
	fprintf(stderr, "usage: pci_fake --list | CASE\n");
	return 2;
}
