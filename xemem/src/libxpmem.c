/*
 * libxpmem for host processes, with no kernel module (clowder XEMEM).
 *
 * The library talks to the segment broker (crates/xemem-host: standalone `xemem-broker`, or
 * embedded in clowderd) over a SOCK_SEQPACKET Unix socket: $CLOWDER_XEMEM_SOCKET, else
 * xemem.sock beside $CLOWDER_SOCKET, else /run/clowder/xemem.sock. The packet layout is
 * crates/xemem-host/src/wire.rs.
 *
 * Sharing works by file descriptor. An owner's memory must be nameable by a file, so:
 *  - memfd-backed (and other MAP_SHARED file) mappings are handed out as they are;
 *  - private writable memory (heap, anonymous mmap, .data/.bss) is converted in place into
 *    memfd-backed shared memory: copy it into a fresh memfd, then mmap(MAP_FIXED|MAP_SHARED)
 *    the memfd over the same addresses. Contents and addresses stay; only the backing changes.
 *    Explicit ranges are converted by xpmem_make; a whole-address-space segment converts each
 *    range lazily, when somebody attaches it.
 *  - everything else (the main stack, read-only or PROT_NONE mappings, gaps) is a hole: an
 *    attacher touching it gets SIGBUS, as XPMEM gives for unmapped source pages.
 * A per-process service thread answers the broker's FETCH requests with runs of
 * (memfd, offset, length) and passes the memfds with SCM_RIGHTS; the attacher mmaps them into
 * one reserved range. No page is copied at attach time, and the cost grows with the number of
 * mappings in the range, not the number of pages.
 *
 * Revocation (SIGBUS after remove or owner exit): an attacher's mapping of a converted memfd
 * dies when that memfd is truncated. On xpmem_remove the owner first moves its own pages to a
 * new memfd (one copy of the pages it handed out), then truncates the old one; when the owner
 * exits, the broker truncates the converted memfds it saw. See docs/xemem.md for the caveats
 * (memfds the application made itself are not revoked; overlapping segments share backing).
 *
 * Conversions are safe against concurrent writers in the owner: the range is made read-only
 * while it is copied, and a temporary SIGSEGV handler parks any thread that writes to it until
 * the shared mapping is in place, then lets the write happen there. fork() children get their
 * converted memory back as private copy-on-write-like memory (pthread_atfork), so a child
 * cannot scribble on its parent's exported pages.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "xpmem.h"

#define EXPORT __attribute__((visibility("default")))

#define PAGE 4096UL
#define HUGE_PAGE (2UL << 20)
#define USER_LIMIT 0x7ffffffff000UL

/* ---- the broker protocol (crates/xemem-host/src/wire.rs) ------------------------------- */

#define WIRE_MAGIC 0x4d4d4558u
#define WIRE_VERSION 1
#define WIRE_HOLE 0xffffffffu
#define WIRE_REVOCABLE 1u
#define WIRE_MAX_RUNS 4096
#define WIRE_MAX_FDS 250

enum {
	OP_HELLO = 1, OP_SERVE = 2, OP_MAKE = 3, OP_REMOVE = 4, OP_GET = 5, OP_RELEASE = 6,
	OP_ATTACH = 7, OP_DETACH = 8, OP_LOOKUP = 9, OP_SIGNAL = 10, OP_FETCH = 16, OP_NOTIFY = 17,
	OP_REVOKE = 18,
};
/* In a GET's answer (results[2]): attachments through the permit are revoked by
 * OP_REVOKE (another enclave's memory, which cannot be truncated under us). */
#define WIRE_GET_REVOKED_BY_MESSAGE 1u

struct wire_request {
	uint32_t magic;
	uint16_t version, op;
	uint64_t args[7];
	char name[XEMEM_NAME_MAX];
};

struct wire_answer {
	uint32_t magic;
	uint16_t version, op;
	int32_t error;
	uint32_t runs;
	uint64_t results[6];
};

struct wire_run {
	uint32_t fd_index, flags;
	uint64_t offset, length, zero;
};

_Static_assert(sizeof(struct wire_answer) == 64, "answer header is 64 bytes");
_Static_assert(sizeof(struct wire_run) == 32, "a run is 32 bytes");
_Static_assert(offsetof(struct wire_request, name) == 64, "request header is 64 bytes");

/* ---- process state --------------------------------------------------------------------- */

/* call_lock serialises requests on call_fd; table_lock guards the tables below. Lock order:
 * call_lock before table_lock; the service thread takes only table_lock. */
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static int call_fd = -1;
static int serve_fd = -1;

/* A memfd this library made by converting private memory. Where it is mapped is read from
 * /proc/self/maps whenever needed, never remembered: the application may munmap, mremap
 * (realloc does) or mprotect it at will. */
struct backing {
	int fd;
	size_t len;
	dev_t dev;
	ino_t ino;
	int handed_out; /* given to an attacher: revoke on remove */
};

/* One current mapping of a backing (from /proc/self/maps). */
struct placement {
	uintptr_t start, end;
	uint64_t offset;
	int prot;
	size_t backing;
};

/* Segments this process made. */
struct segment {
	xpmem_segid_t segid;
	uintptr_t vaddr;
	size_t size;
	int notify_fd;
};

/* One run of an attachment as the owner's answer named it: a range of a file. */
struct run_identity {
	dev_t dev;
	ino_t ino;
	uint64_t offset, length;
};

/* Attachments this process holds. */
struct attachment {
	uintptr_t base;
	size_t size;
	xpmem_apid_t apid;
	int64_t offset; /* in the segment */
	/* The runs it maps, for taking it up again (see park_attachment); none when it has a hole
	 * or is too small to be worth it. */
	struct run_identity *runs;
	uint32_t nruns;
	/* Detached by the application and moved where it never looks: see park_attachment. */
	int parked;
	uint64_t parked_order;
};

static struct backing *backings;
static size_t backing_count, backing_capacity;
static struct segment *segments;
static size_t segment_count, segment_capacity;
static struct attachment *attachments;
static size_t attachment_count, attachment_capacity;
static int hole_fd = -1;

static int grow(void **array, size_t *capacity, size_t count, size_t item)
{
	if (count < *capacity)
		return 0;
	size_t wanted = *capacity ? *capacity * 2 : 16;
	void *bigger = realloc(*array, wanted * item);
	if (!bigger)
		return -1;
	*array = bigger;
	*capacity = wanted;
	return 0;
}

/* ---- the broker connection ------------------------------------------------------------ */

/* $CLOWDER_XEMEM_SOCKET; else xemem.sock beside the daemon's socket ($CLOWDER_SOCKET, which
 * moves the daemon and every client); else /run/clowder/xemem.sock. */
static const char *socket_path(void)
{
	static char beside_daemon[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *path = getenv("CLOWDER_XEMEM_SOCKET");
	if (path && *path)
		return path;
	const char *daemon = getenv("CLOWDER_SOCKET");
	const char *slash = daemon ? strrchr(daemon, '/') : NULL;
	if (slash && (size_t)(slash - daemon) + sizeof "/xemem.sock" <= sizeof beside_daemon) {
		memcpy(beside_daemon, daemon, slash - daemon);
		strcpy(beside_daemon + (slash - daemon), "/xemem.sock");
		return beside_daemon;
	}
	return "/run/clowder/xemem.sock";
}

static int connect_broker(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	const char *path = socket_path();
	if (strlen(path) >= sizeof addr.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(addr.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
		int saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

static int send_packet(int fd, const void *bytes, size_t len, const int *fds, int nfds)
{
	struct iovec iov = { .iov_base = (void *)bytes, .iov_len = len };
	union {
		char buf[CMSG_SPACE(WIRE_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *header = CMSG_FIRSTHDR(&msg);
		header->cmsg_level = SOL_SOCKET;
		header->cmsg_type = SCM_RIGHTS;
		header->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(header), fds, nfds * sizeof(int));
	}
	ssize_t sent;
	do
		sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (sent < 0 && errno == EINTR);
	return sent < 0 ? -1 : 0;
}

/* Receives one packet; descriptors land in fds (up to WIRE_MAX_FDS). Returns its length,
 * 0 when the peer closed, -1 on error. */
static ssize_t receive_packet(int fd, void *bytes, size_t len, int *fds, int *nfds)
{
	struct iovec iov = { .iov_base = bytes, .iov_len = len };
	union {
		char buf[CMSG_SPACE(WIRE_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			      .msg_controllen = sizeof control.buf };
	ssize_t got;
	do
		got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	while (got < 0 && errno == EINTR);
	*nfds = 0;
	if (got < 0)
		return -1;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		int n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (int i = 0; i < n; i++) {
			int received;
			memcpy(&received, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			if (*nfds < WIRE_MAX_FDS)
				fds[(*nfds)++] = received;
			else
				close(received);
		}
	}
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		for (int i = 0; i < *nfds; i++)
			close(fds[i]);
		*nfds = 0;
		errno = EPROTO;
		return -1;
	}
	return got;
}

static void close_all(int *fds, int nfds)
{
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
}

static void atfork_prepare(void);
static void atfork_parent(void);
static void atfork_child(void);
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* One request and its answer. With runs != NULL the answer's runs and descriptors are
 * returned (the caller closes the descriptors); otherwise any are closed. Returns 0, or -1
 * with errno (the broker's errno, or a connection error). Call with call_lock held. */
/* The reason code (xemem::Error::code) of the calling thread's last failed broker call, or 0:
 * see xemem_errmsg. */
static __thread uint64_t last_reason __attribute__((tls_model("initial-exec")));

/* Reasons an errno does not tell apart, by their code in crates/xemem/src/lib.rs. */
static const char *reason_text(uint64_t code)
{
	switch (code) {
	case 8:
		return "the segment's memory is on 2 MiB pages (a hugepage enclave's RAM), which another "
		       "process can map only whole: attach whole, aligned 2 MiB pages of it (offset and size "
		       "multiples of 2 MiB over memory its owner exported in whole pages)";
	default:
		return NULL;
	}
}

/* Keeps a failed answer's reason for xemem_errmsg and, under CLOWDER_XEMEM_DEBUG=1, says it. */
static void note_reason(const struct wire_answer *answer)
{
	last_reason = answer->error ? answer->results[0] : 0;
	const char *text = reason_text(last_reason);
	const char *debug = getenv("CLOWDER_XEMEM_DEBUG");
	if (text && debug && debug[0] == '1')
		fprintf(stderr, "libxpmem: broker op %u failed (%s): %s\n", answer->op, strerror(answer->error), text);
}

EXPORT const char *xemem_errmsg(void)
{
	return reason_text(last_reason);
}

static int call_locked(struct wire_request *request, size_t name_len, struct wire_answer *answer,
		       struct wire_run *runs, int *fds, int *nfds)
{
	last_reason = 0;
	static char buffer[sizeof(struct wire_answer) + WIRE_MAX_RUNS * sizeof(struct wire_run)];
	int local_nfds = 0;
	int received_fds[WIRE_MAX_FDS];
	for (int attempt = 0; attempt < 2; attempt++) {
		if (call_fd < 0) {
			call_fd = connect_broker();
			if (call_fd < 0)
				return -1;
		}
		request->magic = WIRE_MAGIC;
		request->version = WIRE_VERSION;
		if (send_packet(call_fd, request, 64 + name_len, NULL, 0) < 0) {
			/* A broker restart leaves a dead connection: reconnect once. */
			close(call_fd);
			call_fd = -1;
			continue;
		}
		ssize_t got = receive_packet(call_fd, buffer, sizeof buffer, received_fds, &local_nfds);
		if (got <= 0) {
			int saved = got == 0 ? ECONNRESET : errno;
			close(call_fd);
			call_fd = -1;
			errno = saved;
			return -1;
		}
		memcpy(answer, buffer, sizeof *answer);
		size_t expected = sizeof *answer + (size_t)answer->runs * sizeof(struct wire_run);
		if ((size_t)got < sizeof *answer || answer->magic != WIRE_MAGIC || answer->op != request->op ||
		    answer->runs > WIRE_MAX_RUNS || (size_t)got != expected) {
			close_all(received_fds, local_nfds);
			errno = EPROTO;
			return -1;
		}
		note_reason(answer);
		if (answer->error) {
			close_all(received_fds, local_nfds);
			errno = answer->error;
			return -1;
		}
		if (runs) {
			memcpy(runs, buffer + sizeof *answer, answer->runs * sizeof(struct wire_run));
			memcpy(fds, received_fds, local_nfds * sizeof(int));
			*nfds = local_nfds;
		} else {
			close_all(received_fds, local_nfds);
		}
		return 0;
	}
	errno = ECONNRESET;
	return -1;
}

static int call(uint16_t op, const uint64_t *args, int nargs, const char *name, struct wire_answer *answer)
{
	struct wire_request request = { .op = op };
	for (int i = 0; i < nargs; i++)
		request.args[i] = args[i];
	size_t name_len = name ? strlen(name) : 0;
	if (name_len > XEMEM_NAME_MAX) {
		errno = EINVAL;
		return -1;
	}
	if (name_len)
		memcpy(request.name, name, name_len);
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&call_lock);
	int result = call_locked(&request, name_len, answer, NULL, NULL, NULL);
	int saved = errno;
	pthread_mutex_unlock(&call_lock);
	errno = saved;
	return result;
}

/* ---- /proc/self/maps ------------------------------------------------------------------- */

struct mapping {
	uintptr_t start, end;
	char perms[5];
	uint64_t offset;
	unsigned major, minor;
	unsigned long inode;
	char path[64];
	int after_guard; /* directly above a PROT_NONE mapping: how glibc lays out thread stacks */
};

/* The text of /proc/self/maps, the mappings overlapping [lo, hi): what read_maps falls back
 * to on kernels without PROCMAP_QUERY. Returns a malloc'd array (count in *count). */
static struct mapping *parse_maps_text(uintptr_t lo, uintptr_t hi, size_t *count)
{
	*count = 0;
	FILE *maps = fopen("/proc/self/maps", "re");
	if (!maps)
		return NULL;
	struct mapping *list = NULL;
	size_t capacity = 0;
	char line[512];
	uintptr_t guard_end = 0;
	while (fgets(line, sizeof line, maps)) {
		struct mapping m = { 0 };
		int path_at = 0;
		if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu %n", &m.start, &m.end, m.perms, &m.offset, &m.major,
			   &m.minor, &m.inode, &path_at) < 7)
			continue;
		m.after_guard = guard_end != 0 && guard_end == m.start;
		guard_end = !strcmp(m.perms, "---p") ? m.end : 0;
		if (m.end <= lo || m.start >= hi)
			continue;
		if (path_at > 0) {
			size_t n = strcspn(line + path_at, "\n");
			if (n >= sizeof m.path)
				n = sizeof m.path - 1;
			memcpy(m.path, line + path_at, n);
		}
		if (grow((void **)&list, &capacity, *count, sizeof *list) < 0)
			break;
		list[(*count)++] = m;
	}
	fclose(maps);
	return list;
}

/* PROCMAP_QUERY (Linux 6.11, <linux/fs.h>, which older headers lack): one mapping of
 * /proc/self/maps by address, as numbers. Each attach an owner serves looks at its mappings;
 * the text of all of them costs the kernel ~20 us to write (~100 us with cold caches), a query
 * of the one or two in the range a few. */
#define PROCMAP_QUERY_IOCTL 0xc0686611UL /* _IOWR('f', 17, struct procmap_query) */
enum {
	QUERY_READABLE = 0x01, QUERY_WRITABLE = 0x02, QUERY_EXECUTABLE = 0x04, QUERY_SHARED = 0x08,
	QUERY_COVERING_OR_NEXT = 0x10, QUERY_FILE_BACKED = 0x20,
};
struct procmap_query {
	uint64_t size, query_flags, query_addr;
	uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};
/* Set once a query failed as on a kernel without PROCMAP_QUERY, or from the start with
 * CLOWDER_XEMEM_MAPS=text (so that tests run the text path too): the text from then on. */
static _Atomic int maps_query_missing = -1;

/* The mapping at or above `at` that has every QUERY_ flag in `required`, into *m (with its name
 * when `named` and it fits in m->path: only the kernel's own short names matter); 0, or -1
 * with errno (ENOENT: none). */
static int query_mapping(int fd, uintptr_t at, uint64_t required, int named, struct mapping *m)
{
	*m = (struct mapping){ 0 };
	struct procmap_query q = { .size = sizeof q, .query_flags = QUERY_COVERING_OR_NEXT | required, .query_addr = at };
	if (named) {
		q.vma_name_addr = (uintptr_t)m->path;
		q.vma_name_size = sizeof m->path;
	}
	int result = ioctl(fd, PROCMAP_QUERY_IOCTL, &q);
	if (result < 0 && errno == ENAMETOOLONG) {
		q.vma_name_addr = 0;
		q.vma_name_size = 0;
		result = ioctl(fd, PROCMAP_QUERY_IOCTL, &q);
	}
	if (result < 0)
		return -1;
	m->start = q.vma_start;
	m->end = q.vma_end;
	m->perms[0] = q.vma_flags & QUERY_READABLE ? 'r' : '-';
	m->perms[1] = q.vma_flags & QUERY_WRITABLE ? 'w' : '-';
	m->perms[2] = q.vma_flags & QUERY_EXECUTABLE ? 'x' : '-';
	m->perms[3] = q.vma_flags & QUERY_SHARED ? 's' : 'p';
	m->offset = q.vma_offset;
	m->major = q.dev_major;
	m->minor = q.dev_minor;
	m->inode = q.inode;
	return 0;
}

static int convertible(const struct mapping *m);

/* The mappings overlapping [lo, hi) that have every QUERY_ flag in `required`, by
 * PROCMAP_QUERY; NULL with *missing set when this kernel has none. */
static struct mapping *query_maps(uintptr_t lo, uintptr_t hi, uint64_t required, size_t *count, int *missing)
{
	*count = 0;
	*missing = 0;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct mapping *list = NULL;
	size_t capacity = 0;
	for (uintptr_t at = lo; at < hi;) {
		struct mapping m;
		if (query_mapping(fd, at, required, !required, &m) < 0) {
			if (errno != ENOENT) {
				*missing = errno == ENOTTY || errno == EINVAL;
				free(list);
				list = NULL;
				*count = 0;
			}
			break;
		}
		if (m.start >= hi)
			break;
		/* Directly above a "---p" mapping: see struct mapping (only convertible memory asks). */
		struct mapping below;
		if (!required && convertible(&m) && m.start > 0 && query_mapping(fd, m.start - 1, 0, 0, &below) == 0)
			m.after_guard = below.end == m.start && !strcmp(below.perms, "---p");
		if (grow((void **)&list, &capacity, *count, sizeof *list) < 0)
			break;
		list[(*count)++] = m;
		at = m.end;
	}
	close(fd);
	return list;
}

/* Reads the mappings overlapping [lo, hi) that have every QUERY_ flag in `required` (the
 * text's mappings are all returned: callers look at what they need). Returns a malloc'd array
 * (count in *count). */
static struct mapping *read_maps_with(uintptr_t lo, uintptr_t hi, uint64_t required, size_t *count)
{
	if (maps_query_missing < 0) {
		const char *forced = getenv("CLOWDER_XEMEM_MAPS");
		maps_query_missing = forced && !strcmp(forced, "text");
	}
	if (!maps_query_missing) {
		int missing;
		struct mapping *list = query_maps(lo, hi, required, count, &missing);
		if (!missing)
			return list;
		maps_query_missing = 1;
	}
	return parse_maps_text(lo, hi, count);
}

/* Reads the mappings overlapping [lo, hi). Returns a malloc'd array (count in *count). */
static struct mapping *read_maps(uintptr_t lo, uintptr_t hi, size_t *count)
{
	return read_maps_with(lo, hi, 0, count);
}

static int special_mapping(const struct mapping *m)
{
	/* The main stack, and pages the kernel provides, are never converted. */
	return !strncmp(m->path, "[stack", 6) || !strcmp(m->path, "[vvar]") || !strcmp(m->path, "[vdso]") ||
	       !strcmp(m->path, "[vsyscall]") || !strncmp(m->path, "[vvar_vclock", 12);
}

static int convertible(const struct mapping *m)
{
	return m->perms[0] == 'r' && m->perms[1] == 'w' && m->perms[3] == 'p' && !special_mapping(m);
}

static int prot_of(const struct mapping *m)
{
	return (m->perms[0] == 'r' ? PROT_READ : 0) | (m->perms[1] == 'w' ? PROT_WRITE : 0) |
	       (m->perms[2] == 'x' ? PROT_EXEC : 0);
}

/* Thread stacks must never be frozen: a thread whose stack is read-only cannot take the very
 * signal that would park it. glibc maps a thread stack as a PROT_NONE guard with the stack
 * right above; the kernel may merge the stack with a neighbouring anonymous mapping, so the
 * stack's end is not visible. We keep the first thread_stack_span bytes above a guard out of
 * every conversion (the default stack size, at least 8 MiB), and the service thread's own
 * stack wherever it is. Such memory reads as a hole to attachers (documented). */
static size_t thread_stack_span;
static uintptr_t service_stack_lo, service_stack_hi;

static size_t stack_span(void)
{
	if (!thread_stack_span) {
		pthread_attr_t attr;
		size_t size = 0;
		if (pthread_getattr_default_np(&attr) == 0) {
			pthread_attr_getstacksize(&attr, &size);
			pthread_attr_destroy(&attr);
		}
		thread_stack_span = size > (8UL << 20) ? size : (8UL << 20);
	}
	return thread_stack_span;
}

/* Thread control blocks and static TLS must not be frozen either: every thread writes its
 * own (errno, cancellation state) all the time, and the thread converting would park on its
 * own. In a static binary the main thread's TLS lies in the brk heap; elsewhere it lies in
 * ld.so's memory or, for other threads, at the top of their stacks. On x86-64 the static TLS
 * blocks lie below the thread pointer and the thread control block above it, so we keep
 * the pages of [pointer - (static TLS + surplus), pointer + TCB) out of conversions, for the main
 * thread's pointer (recorded when the library is loaded) and the converting thread's own. */
/* Below the pointer: the modules' static TLS plus glibc's surplus for later dlopens (1664
 * bytes by default); above it: glibc's struct pthread (about 2.3 KiB). Kept tight: the kernel
 * often places an application's next mapping right below the main thread's TLS page. */
#define TLS_SURPLUS 1664UL
#define TCB_SIZE 2560UL
static uintptr_t main_thread_pointer;
static size_t static_tls_size;

static int add_tls_segment(struct dl_phdr_info *info, size_t size, void *total)
{
	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_TLS) {
			size_t align = ph->p_align ? ph->p_align : 1;
			*(size_t *)total += (ph->p_memsz + align - 1) / align * align;
		}
	}
	return 0;
}

/* This library's own writable data (its tables, the freeze state, the fork pipe) is written
 * while memory is frozen, so it is never converted either. In a static program that is the
 * executable's data and bss. */
static uintptr_t own_data_lo, own_data_hi;

static int find_own_data(struct dl_phdr_info *info, size_t size, void *unused)
{
	(void)size;
	(void)unused;
	uintptr_t probe = (uintptr_t)&own_data_lo;
	int ours = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && probe >= lo && probe < lo + ph->p_memsz)
			ours = 1;
	}
	if (!ours)
		return 0; /* keep looking */
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W))
			continue;
		uintptr_t lo = (info->dlpi_addr + ph->p_vaddr) & ~(PAGE - 1);
		uintptr_t hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz + PAGE - 1) & ~(PAGE - 1);
		own_data_lo = own_data_lo && own_data_lo < lo ? own_data_lo : lo;
		own_data_hi = own_data_hi > hi ? own_data_hi : hi;
	}
	return 1; /* found: stop */
}

__attribute__((constructor)) static void record_main_thread(void)
{
	main_thread_pointer = (uintptr_t)pthread_self(); /* on x86-64, the thread pointer */
	dl_iterate_phdr(add_tls_segment, &static_tls_size);
	dl_iterate_phdr(find_own_data, NULL);
}

/* Subtracts [lo, hi) from the ranges in list (at most `max`); returns the new count. */
static int subtract(uintptr_t list[][2], int n, int max, uintptr_t lo, uintptr_t hi)
{
	for (int i = 0; i < n; i++) {
		uintptr_t a = list[i][0], b = list[i][1];
		if (hi <= a || lo >= b)
			continue;
		if (lo > a && hi < b && n < max) { /* splits in two */
			list[n][0] = hi;
			list[n][1] = b;
			n++;
			list[i][1] = lo;
		} else if (lo > a) {
			list[i][1] = lo;
		} else if (hi < b) {
			list[i][0] = hi;
		} else {
			list[i][0] = list[i][1] = 0; /* nothing left */
		}
	}
	return n;
}

/* The parts of [start, end) (inside mapping m) that may be converted, into parts (at most 8):
 * without a possible thread stack at the bottom of m, the service thread's stack, and the TLS
 * around the main thread's and this thread's thread pointers. Returns how many. */
/* glibc puts a thread's control block at the top of its stack, and the next mapping up may be
 * the application's data: TCB_SIZE rounded up to a page must not reach past the stack's top, or
 * the first page of that data is never converted and reads as a hole (SIGBUS for attachers). */
static uintptr_t clip_to_own_stack_top(uintptr_t thread_pointer, uintptr_t hi)
{
	pthread_attr_t attr;
	void *stack;
	size_t stack_size;
	if (pthread_getattr_np(pthread_self(), &attr) != 0)
		return hi;
	if (pthread_attr_getstack(&attr, &stack, &stack_size) == 0) {
		uintptr_t top = (uintptr_t)stack + stack_size;
		if (thread_pointer < top && hi > top)
			hi = top;
	}
	pthread_attr_destroy(&attr);
	return hi;
}

static int convertible_parts(const struct mapping *m, uintptr_t start, uintptr_t end, uintptr_t parts[8][2])
{
	int n = 1;
	parts[0][0] = start;
	parts[0][1] = end;
	if (m->after_guard)
		n = subtract(parts, n, 8, m->start, m->start + stack_span());
	n = subtract(parts, n, 8, service_stack_lo, service_stack_hi);
	n = subtract(parts, n, 8, own_data_lo, own_data_hi);
	uintptr_t pointers[2] = { main_thread_pointer, (uintptr_t)pthread_self() };
	for (int i = 0; i < 2; i++) {
		if (!pointers[i])
			continue;
		size_t below = static_tls_size + TLS_SURPLUS;
		uintptr_t lo = (pointers[i] > below ? pointers[i] - below : 0) & ~(PAGE - 1);
		uintptr_t hi = (pointers[i] + TCB_SIZE + PAGE - 1) & ~(PAGE - 1);
		if (i == 1)
			hi = clip_to_own_stack_top(pointers[i], hi);
		n = subtract(parts, n, 8, lo, hi);
	}
	return n;
}

/* ---- in-place conversion --------------------------------------------------------------- */

/* The range being converted: writers fault (it is read-only meanwhile) and wait here. */
static _Atomic uintptr_t converting_lo, converting_hi;
/* Set while a fork's child copies the converted memory: every backing is read-only then. */
static _Atomic int frozen_for_fork;
/* The application's SIGSEGV disposition, which faults that are not ours go to. Our handler,
 * once installed, stays: removing it after a freeze could let a thread that faulted during the
 * freeze, but was delivered the signal only later, die of the restored default action. */
static struct sigaction application_segv;
/* Bumped when a freeze (conversion or fork) starts and when it ends. A thread may fault on
 * frozen memory yet run its handler only after the freeze ended (it was preempted in
 * between), when nothing says the fault was ours. So a fault that looks foreign is retried
 * once; only a fault that repeats at the same address with no freeze in between is real and
 * goes to the application's disposition. */
static _Atomic uint64_t protection_epoch;
static __thread uintptr_t foreign_fault_at __attribute__((tls_model("initial-exec")));
static __thread uint64_t foreign_fault_epoch __attribute__((tls_model("initial-exec")));

static int in_backing(uintptr_t addr);

static void wait_for_conversion(int sig, siginfo_t *info, void *context)
{
	uintptr_t addr = (uintptr_t)info->si_addr;
	uint64_t epoch = atomic_load(&protection_epoch);
	if (addr >= atomic_load(&converting_lo) && addr < atomic_load(&converting_hi)) {
		while (addr >= atomic_load(&converting_lo) && addr < atomic_load(&converting_hi))
			sched_yield();
		return; /* the write is retried, now on the shared mapping */
	}
	if (atomic_load(&frozen_for_fork) && in_backing(addr)) {
		while (atomic_load(&frozen_for_fork))
			sched_yield();
		return; /* retried once the parent's memory is writable again */
	}
	if (info->si_code == SEGV_ACCERR && (foreign_fault_at != addr || foreign_fault_epoch != epoch)) {
		foreign_fault_at = addr;
		foreign_fault_epoch = epoch;
		return; /* once more: it may be a write that raced with the end of a freeze */
	}
	foreign_fault_at = 0;
	/* Not ours: behave as the application's disposition would. */
	if ((application_segv.sa_flags & SA_SIGINFO) && application_segv.sa_sigaction) {
		application_segv.sa_sigaction(sig, info, context);
	} else if (!(application_segv.sa_flags & SA_SIGINFO) && application_segv.sa_handler != SIG_DFL &&
		   application_segv.sa_handler != SIG_IGN) {
		application_segv.sa_handler(sig);
	} else {
		signal(SIGSEGV, SIG_DFL); /* the fault repeats and takes the default action */
	}
}

/* Installs the parking handler unless it is in place (the application may have replaced it
 * since: its handler becomes the one we chain to). */
static void install_parking(void)
{
	struct sigaction current;
	sigaction(SIGSEGV, NULL, &current);
	if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == wait_for_conversion)
		return;
	application_segv = current;
	struct sigaction action = { .sa_sigaction = wait_for_conversion, .sa_flags = SA_SIGINFO | SA_RESTART };
	sigemptyset(&action.sa_mask);
	sigaction(SIGSEGV, &action, NULL);
}

static void guard_begin(uintptr_t lo, uintptr_t hi)
{
	install_parking();
	atomic_fetch_add(&protection_epoch, 1);
	atomic_store(&converting_lo, lo);
	atomic_store(&converting_hi, hi);
}

static void guard_end(void)
{
	atomic_store(&converting_hi, 0);
	atomic_store(&converting_lo, 0);
	atomic_fetch_add(&protection_epoch, 1);
}

static int page_is_zero(const void *page)
{
	const uint64_t *word = page;
	for (size_t i = 0; i < PAGE / sizeof *word; i++)
		if (word[i])
			return 0;
	return 1;
}

/* Copies [src, src+len) to dst, skipping zero pages (dst is fresh zeroed memory): untouched
 * memory stays unallocated in the copy. */
static void copy_nonzero_pages(char *dst, const char *src, size_t len)
{
	for (size_t at = 0; at < len; at += PAGE)
		if (!page_is_zero(src + at))
			memcpy(dst + at, src + at, PAGE);
}

static int new_memfd(size_t len)
{
	int fd = memfd_create("xemem", MFD_CLOEXEC);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, len) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Moves [addr, addr+len) onto a fresh memfd at the same addresses, keeping contents and
 * protection. Returns the memfd, or -1 (the memory is then untouched). table_lock held. */
static int move_to_memfd(uintptr_t addr, size_t len, int prot)
{
	int fd = new_memfd(len);
	if (fd < 0)
		return -1;
	char *shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (shadow == MAP_FAILED) {
		close(fd);
		return -1;
	}
	guard_begin(addr, addr + len);
	int frozen = (prot & PROT_WRITE) ? mprotect((void *)addr, len, prot & ~PROT_WRITE) : 0;
	int moved = -1;
	if (frozen == 0) {
		copy_nonzero_pages(shadow, (const char *)addr, len);
		/* MAP_FIXED replaces the old mapping atomically: no window without memory. */
		moved = mmap((void *)addr, len, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED ? -1 : 0;
		if (moved < 0)
			mprotect((void *)addr, len, prot);
	}
	guard_end();
	munmap(shadow, len);
	if (moved < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int add_backing(int fd, size_t len)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || grow((void **)&backings, &backing_capacity, backing_count, sizeof *backings) < 0)
		return -1;
	backings[backing_count++] = (struct backing){ .fd = fd, .len = len, .dev = st.st_dev, .ino = st.st_ino };
	return 0;
}

/* Converts the private writable memory in [lo, hi) to memfd backing, given the process's
 * mappings; returns whether it moved any (the mappings are then out of date). table_lock held. */
static int convert_range(const struct mapping *maps, size_t count, uintptr_t lo, uintptr_t hi)
{
	int moved = 0;
	for (size_t i = 0; i < count; i++) {
		if (maps[i].end <= lo || maps[i].start >= hi || !convertible(&maps[i]))
			continue;
		uintptr_t start = maps[i].start > lo ? maps[i].start : lo;
		uintptr_t end = maps[i].end < hi ? maps[i].end : hi;
		uintptr_t parts[8][2];
		int n = convertible_parts(&maps[i], start, end, parts);
		int prot = prot_of(&maps[i]);
		for (int k = 0; k < n; k++) {
			if (parts[k][0] >= parts[k][1])
				continue;
			size_t len = parts[k][1] - parts[k][0];
			int fd = move_to_memfd(parts[k][0], len, prot);
			moved = 1;
			if (fd >= 0 && add_backing(fd, len) < 0)
				close(fd); /* the mapping stays shared; it just cannot be revoked */
		}
	}
	return moved;
}

static int overlaps_attachment(uintptr_t lo, uintptr_t hi);

static struct backing *backing_for(unsigned major, unsigned minor, unsigned long inode)
{
	for (size_t i = 0; i < backing_count; i++)
		if (backings[i].ino == inode && major(backings[i].dev) == major && minor(backings[i].dev) == minor)
			return &backings[i];
	return NULL;
}

/* The shared file mappings overlapping [lo, hi): where backings can be. */
static struct mapping *read_shared_file_maps(uintptr_t lo, uintptr_t hi, size_t *count)
{
	return read_maps_with(lo, hi, QUERY_SHARED | QUERY_FILE_BACKED, count);
}

/* Where the backings are mapped now, within [lo, hi). Returns a malloc'd array. */
static struct placement *placements(uintptr_t lo, uintptr_t hi, size_t *count)
{
	size_t nmaps;
	struct mapping *maps = read_shared_file_maps(lo, hi, &nmaps);
	struct placement *list = malloc((nmaps ? nmaps : 1) * sizeof *list);
	*count = 0;
	for (size_t i = 0; list && i < nmaps; i++) {
		struct backing *b = maps[i].perms[3] == 's' ? backing_for(maps[i].major, maps[i].minor, maps[i].inode) : NULL;
		/* Our own attachments of our own segments map backings too: they are not the
		 * owner's memory, and must not be moved, copied into fork children or counted. */
		if (b && !overlaps_attachment(maps[i].start, maps[i].end))
			list[(*count)++] = (struct placement){ .start = maps[i].start, .end = maps[i].end,
							       .offset = maps[i].offset, .prot = prot_of(&maps[i]),
							       .backing = (size_t)(b - backings) };
	}
	free(maps);
	return list;
}

static void drop_backing(size_t index)
{
	close(backings[index].fd);
	backings[index] = backings[--backing_count];
}

static int by_offset(const void *a, const void *b)
{
	const struct placement *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Frees converted memory the application has unmapped since it was converted: a backing no
 * longer mapped anywhere is truncated (its attachers see SIGBUS, as XPMEM gives after the
 * owner's munmap) and closed; parts of a backing no longer mapped are punched out (attachers
 * read zeros there). Run before every make, attach service and remove. table_lock held. */
static void prune_backings(void)
{
	if (backing_count == 0)
		return;
	size_t count;
	struct placement *all = placements(0, UINTPTR_MAX, &count);
	if (!all)
		return;
	struct placement *mine = malloc((count ? count : 1) * sizeof *mine);
	for (size_t b = backing_count; mine && b-- > 0;) {
		size_t n = 0;
		for (size_t i = 0; i < count; i++)
			if (all[i].backing == b)
				mine[n++] = all[i];
		if (n == 0) {
			if (ftruncate(backings[b].fd, 0) < 0) {
				/* cannot happen for our unsealed memfds; closing still drops our reference */
			}
			/* Indices in `all` above b would shift with the swap in drop_backing: fix them. */
			for (size_t i = 0; i < count; i++)
				if (all[i].backing == backing_count - 1)
					all[i].backing = b;
			drop_backing(b);
			continue;
		}
		qsort(mine, n, sizeof *mine, by_offset);
		uint64_t covered = 0;
		for (size_t i = 0; i <= n; i++) {
			uint64_t next = i < n ? mine[i].offset : backings[b].len;
			if (next > covered)
				fallocate(backings[b].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, covered, next - covered);
			if (i < n) {
				uint64_t end = mine[i].offset + (mine[i].end - mine[i].start);
				if (end > covered)
					covered = end;
			}
		}
	}
	free(mine);
	free(all);
}

/* Prunes the backings and converts the private memory in [lo, hi); returns the mappings
 * overlapping [lo, hi) as they are then (a malloc'd array). Every attach an owner serves pays
 * this: the mappings in the range are read once, again only after a conversion moved some.
 * table_lock held. */
static struct mapping *prepared_maps(uintptr_t lo, uintptr_t hi, size_t *count)
{
	prune_backings();
	struct mapping *maps = read_maps(lo, hi, count);
	if (convert_range(maps, *count, lo, hi)) {
		free(maps);
		maps = read_maps(lo, hi, count);
	}
	return maps;
}

/* An open descriptor of this process for the file (major:minor, inode), or -1. */
static int find_open_fd(unsigned major, unsigned minor, unsigned long inode)
{
	DIR *dir = opendir("/proc/self/fd");
	if (!dir)
		return -1;
	int found = -1;
	for (struct dirent *entry; (entry = readdir(dir));) {
		char *end;
		long fd = strtol(entry->d_name, &end, 10);
		struct stat st;
		if (*end || fd == dirfd(dir) || fstat(fd, &st) < 0)
			continue;
		if (S_ISREG(st.st_mode) && st.st_ino == inode && major(st.st_dev) == major && minor(st.st_dev) == minor) {
			found = fd;
			break;
		}
	}
	closedir(dir);
	return found;
}

/* ---- the owner's service thread -------------------------------------------------------- */

struct fetch {
	struct wire_run runs[WIRE_MAX_RUNS];
	int nruns;
	int fds[WIRE_MAX_FDS];
	int nfds;
	int close_after[WIRE_MAX_FDS]; /* opened just for this answer */
};

static int fetch_fd_index(struct fetch *f, int fd, int close_after)
{
	for (int i = 0; i < f->nfds; i++)
		if (f->fds[i] == fd) {
			if (close_after)
				close(fd);
			return i;
		}
	if (f->nfds == WIRE_MAX_FDS)
		return -1;
	f->fds[f->nfds] = fd;
	f->close_after[f->nfds] = close_after;
	return f->nfds++;
}

/* Appends a run, merging it with the previous one when they are contiguous. */
static int fetch_add(struct fetch *f, uint32_t fd_index, uint32_t flags, uint64_t offset, uint64_t length)
{
	if (fd_index == WIRE_HOLE)
		offset = 0;
	if (f->nruns > 0) {
		struct wire_run *last = &f->runs[f->nruns - 1];
		if (last->fd_index == fd_index && last->flags == flags &&
		    (fd_index == WIRE_HOLE || last->offset + last->length == offset)) {
			last->length += length;
			return 0;
		}
	}
	if (f->nruns == WIRE_MAX_RUNS)
		return -1;
	f->runs[f->nruns++] = (struct wire_run){ .fd_index = fd_index, .flags = flags, .offset = offset, .length = length };
	return 0;
}

/* Resolves [lo, hi) of this process to runs, converting private memory on the way. */
static int resolve(uintptr_t lo, uintptr_t hi, struct fetch *f)
{
	pthread_mutex_lock(&table_lock);
	size_t count;
	struct mapping *maps = prepared_maps(lo, hi, &count);
	uintptr_t cursor = lo;
	int failed = 0;
	for (size_t i = 0; i < count && !failed; i++) {
		struct mapping *m = &maps[i];
		if (m->end <= lo || m->start >= hi)
			continue;
		uintptr_t start = m->start > lo ? m->start : lo;
		uintptr_t end = m->end < hi ? m->end : hi;
		if (start > cursor)
			failed |= fetch_add(f, WIRE_HOLE, 0, 0, start - cursor);
		cursor = end;
		int index = -1;
		uint32_t flags = 0;
		if (m->perms[3] == 's' && m->inode != 0 && m->perms[0] == 'r') {
			struct backing *b = backing_for(m->major, m->minor, m->inode);
			if (b) {
				index = fetch_fd_index(f, b->fd, 0);
				flags = WIRE_REVOCABLE;
				b->handed_out = 1;
			} else {
				int fd = find_open_fd(m->major, m->minor, m->inode);
				int opened = 0;
				if (fd < 0) {
					/* A shared mapping whose descriptor was closed: map_files names it
					 * (needs CAP_SYS_ADMIN on most kernels). */
					char path[96];
					snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", m->start, m->end);
					fd = open(path, O_RDWR | O_CLOEXEC);
					opened = fd >= 0;
				}
				if (fd >= 0)
					index = fetch_fd_index(f, fd, opened);
			}
		}
		if (index < 0)
			failed |= fetch_add(f, WIRE_HOLE, 0, 0, end - start);
		else
			failed |= fetch_add(f, index, flags, m->offset + (start - m->start), end - start);
	}
	if (cursor < hi && !failed)
		failed |= fetch_add(f, WIRE_HOLE, 0, 0, hi - cursor);
	free(maps);
	pthread_mutex_unlock(&table_lock);
	return failed ? -1 : 0;
}

/* Answers the broker; sequence echoes the request's (args[6] -> results[5]) so the broker can
 * tell a late answer from the one it waits for. */
static void serve_answer(int fd, uint16_t op, uint64_t sequence, int error, struct fetch *f)
{
	static char buffer[sizeof(struct wire_answer) + WIRE_MAX_RUNS * sizeof(struct wire_run)];
	struct wire_answer answer = { .magic = WIRE_MAGIC, .version = WIRE_VERSION, .op = op, .error = error };
	answer.results[5] = sequence;
	size_t len = sizeof answer;
	int with_runs = f && !error;
	if (with_runs) {
		answer.runs = f->nruns;
		memcpy(buffer + sizeof answer, f->runs, f->nruns * sizeof(struct wire_run));
		len += f->nruns * sizeof(struct wire_run);
	}
	memcpy(buffer, &answer, sizeof answer);
	send_packet(fd, buffer, len, with_runs ? f->fds : NULL, with_runs ? f->nfds : 0);
}

static void notify_segment(xpmem_segid_t segid)
{
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < segment_count; i++) {
		if (segments[i].segid != segid)
			continue;
		if (segments[i].notify_fd < 0)
			segments[i].notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		uint64_t one = 1;
		if (segments[i].notify_fd >= 0 && write(segments[i].notify_fd, &one, sizeof one) < 0) {
			/* the counter is saturated: the owner has plenty to read already */
		}
	}
	pthread_mutex_unlock(&table_lock);
}

static int hole_descriptor(void);
static void drop_parked(xpmem_apid_t apid);

/* Another enclave's segment is gone: every attachment made through apid now maps the empty
 * memfd instead, so touching it raises SIGBUS as after an XPMEM remove. The attachment stays
 * in the table until the application detaches it. table_lock held. */
static void revoke_attachments_locked(xpmem_apid_t apid)
{
	drop_parked(apid);
	int hole = hole_descriptor();
	for (size_t i = 0; i < attachment_count; i++) {
		struct attachment *a = &attachments[i];
		if (a->apid != apid)
			continue;
		if (hole < 0 || mmap((void *)a->base, a->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, hole, 0) == MAP_FAILED)
			mmap((void *)a->base, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		madvise((void *)a->base, a->size, MADV_DONTFORK);
	}
}

/* Permits whose attachments the broker revokes by message (other enclaves' segments, and
 * every segment under a sub-manager daemon): see broker_gone. table_lock guards them. */
static xpmem_apid_t *message_permits;
static size_t message_permit_count, message_permit_capacity;

static void forget_message_permit(xpmem_apid_t apid)
{
	for (size_t i = 0; i < message_permit_count; i++)
		if (message_permits[i] == apid)
			message_permits[i--] = message_permits[--message_permit_count];
}

/* The broker closed the serving connection: the daemon is gone (killed, crashed). The
 * enclaves whose memory we map stop with it, and nobody is left to revoke our attachments of
 * their memory, so we do it ourselves: each maps the empty memfd (SIGBUS on the next touch,
 * as after a remove), which also lets go of the enclave's RAM memfd. A later get opens a new
 * serving connection (a restarted daemon). */
static void broker_gone(int fd)
{
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < message_permit_count; i++)
		revoke_attachments_locked(message_permits[i]);
	message_permit_count = 0;
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_lock(&call_lock);
	if (serve_fd == fd) {
		close(fd);
		serve_fd = -1;
	}
	pthread_mutex_unlock(&call_lock);
}

static void *serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	static struct fetch fetch;
	pthread_attr_t attr;
	if (pthread_getattr_np(pthread_self(), &attr) == 0) {
		void *stack;
		size_t size;
		if (pthread_attr_getstack(&attr, &stack, &size) == 0) {
			pthread_mutex_lock(&table_lock);
			service_stack_lo = (uintptr_t)stack;
			service_stack_hi = (uintptr_t)stack + size;
			pthread_mutex_unlock(&table_lock);
		}
		pthread_attr_destroy(&attr);
	}
	for (;;) {
		struct wire_request request;
		int fds[WIRE_MAX_FDS], nfds;
		ssize_t got = receive_packet(fd, &request, sizeof request, fds, &nfds);
		close_all(fds, nfds);
		if (got < 0 && errno == EPROTO)
			continue; /* a packet too large was dropped; the connection holds */
		if (got <= 0) {
			broker_gone(fd);
			break;
		}
		if ((size_t)got < 64 || request.magic != WIRE_MAGIC || request.version != WIRE_VERSION) {
			serve_answer(fd, 0, 0, EPROTO, NULL);
			continue;
		}
		if (request.op == OP_FETCH) {
			uint64_t lo = request.args[0], len = request.args[1];
			if (lo % PAGE || len % PAGE || len == 0 || lo + len < lo || lo + len > USER_LIMIT) {
				serve_answer(fd, request.op, request.args[6], EINVAL, NULL);
				continue;
			}
			fetch.nruns = fetch.nfds = 0;
			int failed = resolve(lo, lo + len, &fetch);
			serve_answer(fd, request.op, request.args[6], failed ? ENOMEM : 0, &fetch);
			for (int i = 0; i < fetch.nfds; i++)
				if (fetch.close_after[i])
					close(fetch.fds[i]);
		} else if (request.op == OP_NOTIFY) {
			notify_segment((xpmem_segid_t)request.args[0]);
			serve_answer(fd, request.op, request.args[6], 0, NULL);
		} else if (request.op == OP_REVOKE) {
			pthread_mutex_lock(&table_lock);
			revoke_attachments_locked((xpmem_apid_t)request.args[0]);
			pthread_mutex_unlock(&table_lock);
			serve_answer(fd, request.op, request.args[6], 0, NULL);
		} else {
			serve_answer(fd, request.op, request.args[6], EINVAL, NULL);
		}
	}
	return NULL;
}

/* Opens the serving connection and starts the service thread (once per process). */
static int ensure_serving(void)
{
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&call_lock);
	int result = 0;
	if (serve_fd < 0) {
		int fd = connect_broker();
		struct wire_request request = { .magic = WIRE_MAGIC, .version = WIRE_VERSION, .op = OP_SERVE };
		struct wire_answer answer;
		int fds[WIRE_MAX_FDS], nfds = 0;
		if (fd < 0 || send_packet(fd, &request, 64, NULL, 0) < 0 ||
		    receive_packet(fd, &answer, sizeof answer, fds, &nfds) != sizeof answer || answer.error) {
			int saved = errno ? errno : ECONNREFUSED;
			close_all(fds, nfds);
			if (fd >= 0)
				close(fd);
			result = -1;
			errno = saved;
		} else {
			pthread_t thread;
			pthread_attr_t attr;
			sigset_t all, old;
			pthread_attr_init(&attr);
			pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
			/* Signals are the application's business: the service thread takes none, except
			 * the faults it may raise itself: it must be able to park on memory another
			 * thread is converting (a blocked SIGSEGV would kill the process instead). */
			sigfillset(&all);
			sigdelset(&all, SIGSEGV);
			sigdelset(&all, SIGBUS);
			sigdelset(&all, SIGILL);
			sigdelset(&all, SIGFPE);
			pthread_sigmask(SIG_SETMASK, &all, &old);
			if (pthread_create(&thread, &attr, serve, (void *)(intptr_t)fd) != 0) {
				close(fd);
				result = -1;
				errno = EAGAIN;
			} else {
				serve_fd = fd;
			}
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			pthread_attr_destroy(&attr);
		}
	}
	pthread_mutex_unlock(&call_lock);
	return result;
}

/* ---- fork ------------------------------------------------------------------------------ */


/* fork() must give the child the converted memory as it was at the fork, privately. The
 * child copies it (below); until it has, the forking thread waits for the child's word and the
 * parent's backings are read-only, so its other threads' writes park in the SIGSEGV handler.
 * The freeze starts in the parent handler, after fork: freezing before it could deadlock, as a
 * thread parked while holding a malloc lock would stop glibc's fork from taking that lock. A
 * write by another parent thread in the moment between fork and freeze may reach the child
 * (single-threaded parents have no such moment). */
static int fork_sync[2] = { -1, -1 };
static struct placement *frozen;
static size_t frozen_count;

/* From the signal handler, while a fork is in progress (the list does not change then). */
static int in_backing(uintptr_t addr)
{
	for (size_t i = 0; i < frozen_count; i++)
		if (addr >= frozen[i].start && addr < frozen[i].end)
			return 1;
	return 0;
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&call_lock);
	pthread_mutex_lock(&table_lock);
	frozen_count = 0;
	if (backing_count == 0 || pipe2(fork_sync, O_CLOEXEC) < 0) {
		fork_sync[0] = fork_sync[1] = -1;
		return;
	}
	free(frozen);
	frozen = placements(0, UINTPTR_MAX, &frozen_count);
	if (!frozen)
		frozen_count = 0;
}

static void atfork_parent(void)
{
	if (fork_sync[0] >= 0) {
		install_parking();
		atomic_fetch_add(&protection_epoch, 1);
		atomic_store(&frozen_for_fork, 1);
		for (size_t i = 0; i < frozen_count; i++)
			if (frozen[i].prot & PROT_WRITE)
				mprotect((void *)frozen[i].start, frozen[i].end - frozen[i].start,
					 frozen[i].prot & ~PROT_WRITE);
		close(fork_sync[1]);
		char done;
		while (read(fork_sync[0], &done, 1) < 0 && errno == EINTR)
			; /* 1 byte: copied; 0: the child died first. Either way the child is done. */
		close(fork_sync[0]);
		fork_sync[0] = fork_sync[1] = -1;
		for (size_t i = 0; i < frozen_count; i++)
			if (frozen[i].prot & PROT_WRITE)
				mprotect((void *)frozen[i].start, frozen[i].end - frozen[i].start, frozen[i].prot);
		atomic_store(&frozen_for_fork, 0);
		atomic_fetch_add(&protection_epoch, 1);
	}
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&call_lock);
}

/* In the child: converted memory becomes private again (a copy, as fork would have given it),
 * segments and permits stay the parent's, attachments are gone (MADV_DONTFORK), and the
 * broker connections are the parent's, so the child drops its copies. */
static void atfork_child(void)
{
	for (size_t i = 0; i < frozen_count; i++) {
		size_t len = frozen[i].end - frozen[i].start;
		char *copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (copy != MAP_FAILED) {
			copy_nonzero_pages(copy, (const char *)frozen[i].start, len);
			mprotect(copy, len, frozen[i].prot);
			if (mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)frozen[i].start) == MAP_FAILED)
				munmap(copy, len);
		}
	}
	frozen_count = 0;
	for (size_t i = 0; i < backing_count; i++)
		close(backings[i].fd);
	backing_count = 0;
	if (fork_sync[1] >= 0) {
		if (write(fork_sync[1], "x", 1) < 0) {
			/* the parent sees EOF when we exit; nothing else to do */
		}
		close(fork_sync[0]);
		close(fork_sync[1]);
		fork_sync[0] = fork_sync[1] = -1;
	}
	for (size_t i = 0; i < segment_count; i++)
		if (segments[i].notify_fd >= 0)
			close(segments[i].notify_fd);
	segment_count = 0;
	/* Attachments, parked ones too, are not inherited (MADV_DONTFORK). */
	for (size_t i = 0; i < attachment_count; i++)
		free(attachments[i].runs);
	attachment_count = 0;
	message_permit_count = 0; /* the parent's */
	if (call_fd >= 0)
		close(call_fd);
	if (serve_fd >= 0)
		close(serve_fd);
	call_fd = serve_fd = -1;
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&call_lock);
}

/* ---- the /dev/xpmem backend ------------------------------------------------------------- */

/* Where /dev/xpmem exists (the XPMEM kernel module on Linux, the lightweight kernel's device),
 * the library speaks its ioctls instead of the broker, so one statically linked program runs
 * on the host and in an enclave. CLOWDER_XEMEM_BACKEND=broker or =device forces the choice.
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
_Static_assert(sizeof(struct xpmem_cmd_make) == 40 && offsetof(struct xpmem_cmd_make, segid) == 32, "make layout");
_Static_assert(sizeof(struct xpmem_cmd_get) == 32 && offsetof(struct xpmem_cmd_get, apid) == 24, "get layout");
_Static_assert(sizeof(struct xpmem_cmd_attach) == 40 && offsetof(struct xpmem_cmd_attach, fd) == 32, "attach layout");

static int device = -1;
static int device_chosen; /* 0 undecided, 1 device, 2 broker */
static int backend_misnamed; /* CLOWDER_XEMEM_BACKEND names neither: every call fails */
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;

static int use_device(void)
{
	pthread_mutex_lock(&device_lock);
	if (!device_chosen) {
		const char *forced = getenv("CLOWDER_XEMEM_BACKEND");
		if (forced && strcmp(forced, "broker") && strcmp(forced, "device")) {
			/* A typo must not silently pick a backend the user did not ask for. */
			fprintf(stderr, "libxpmem: CLOWDER_XEMEM_BACKEND must be 'broker' or 'device', not '%s'; "
					"every XPMEM call fails with EINVAL\n", forced);
			backend_misnamed = 1;
			device_chosen = 1;
		} else if (forced && !strcmp(forced, "broker")) {
			device_chosen = 2;
		} else {
			device = open(XPMEM_DEV_PATH, O_RDWR | O_CLOEXEC);
			device_chosen = device >= 0 || (forced && !strcmp(forced, "device")) ? 1 : 2;
		}
	}
	int chosen = device_chosen == 1;
	pthread_mutex_unlock(&device_lock);
	return chosen;
}

/* One ioctl; a child that inherited the descriptor gets XPMEM_ERRNO_NOPROC and retries on a
 * fresh one, as XPMEM's library does. */
static long device_call(unsigned long command, void *argument)
{
	if (backend_misnamed) {
		errno = EINVAL;
		return -1;
	}
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

static xpmem_segid_t device_make_segment(void *vaddr, size_t size, int permit_type, void *permit_value)
{
	struct xpmem_cmd_make make = { .vaddr = (uintptr_t)vaddr, .size = size, .permit_type = permit_type,
				    .permit_value = (uintptr_t)permit_value };
	if (device_call(XPMEM_CMD_MAKE, &make) < 0)
		return -1;
	return make.segid;
}

static xpmem_apid_t device_get_access(xpmem_segid_t segid, int flags, int permit_type)
{
	/* NULL permit value, as XPMEM's library sends: the kernel refuses anything else. */
	struct xpmem_cmd_get get = { .segid = segid, .flags = flags, .permit_type = permit_type };
	if (device_call(XPMEM_CMD_GET, &get) < 0)
		return -1;
	return get.apid;
}

static void *device_attach_segment(struct xpmem_addr addr, size_t size, void *vaddr)
{
	struct xpmem_cmd_attach attach = { .apid = addr.apid, .offset = addr.offset, .size = size,
					.vaddr = (uintptr_t)vaddr };
	if (device_call(XPMEM_CMD_ATTACH, &attach) < 0)
		return (void *)-1;
	return (void *)(uintptr_t)attach.vaddr;
}

/* ---- the API --------------------------------------------------------------------------- */

EXPORT int xpmem_version(void)
{
	if (use_device())
		return (int)device_call(XPMEM_CMD_VERSION, NULL);
	struct wire_answer answer;
	if (call(OP_HELLO, NULL, 0, NULL, &answer) < 0)
		return -1;
	return XPMEM_CURRENT_VERSION;
}

static xpmem_segid_t make(void *vaddr, size_t size, int permit_type, void *permit_value, const char *name)
{
	uintptr_t addr = (uintptr_t)vaddr;
	uintptr_t mode = (uintptr_t)permit_value;
	if (permit_type != XPMEM_PERMIT_MODE || mode & ~0777UL || size == 0 || addr % PAGE ||
	    (size != XPMEM_MAXADDR_SIZE && (size % PAGE || addr + size < addr || addr + size > USER_LIMIT))) {
		errno = EINVAL;
		return -1;
	}
	if (name && (!*name || strlen(name) > XEMEM_NAME_MAX)) {
		errno = EINVAL;
		return -1;
	}
	if (ensure_serving() < 0)
		return -1;
	size_t effective = size == XPMEM_MAXADDR_SIZE ? (addr < USER_LIMIT ? USER_LIMIT - addr : 0) : size;
	if (size != XPMEM_MAXADDR_SIZE) {
		/* An explicit range is converted now; the whole address space lazily, per attach. */
		pthread_mutex_lock(&table_lock);
		size_t count;
		free(prepared_maps(addr, addr + size, &count));
		pthread_mutex_unlock(&table_lock);
	}
	struct wire_answer answer;
	uint64_t args[] = { addr, size, mode };
	if (call(OP_MAKE, args, 3, name, &answer) < 0)
		return -1;
	xpmem_segid_t segid = (xpmem_segid_t)answer.results[0];
	pthread_mutex_lock(&table_lock);
	if (grow((void **)&segments, &segment_capacity, segment_count, sizeof *segments) == 0)
		segments[segment_count++] = (struct segment){ .segid = segid, .vaddr = addr, .size = effective, .notify_fd = -1 };
	pthread_mutex_unlock(&table_lock);
	return segid;
}

EXPORT xpmem_segid_t xpmem_make(void *vaddr, size_t size, int permit_type, void *permit_value)
{
	if (use_device())
		return device_make_segment(vaddr, size, permit_type, permit_value);
	return make(vaddr, size, permit_type, permit_value, NULL);
}

EXPORT xpmem_segid_t xemem_make(void *vaddr, size_t size, const char *name)
{
	if (!name) {
		errno = EINVAL;
		return -1;
	}
	if (use_device()) {
		/* The LWK's device: XEMEM's own command (the XPMEM module has none: ENOTTY). */
		struct xemem_cmd_make_named named = { .vaddr = (uintptr_t)vaddr, .size = size };
		size_t length = strlen(name);
		if (length == 0 || length > XEMEM_NAME_MAX) {
			errno = EINVAL;
			return -1;
		}
		memcpy(named.name, name, length + 1);
		if (device_call(XEMEM_CMD_MAKE_NAMED, &named) < 0)
			return -1;
		return named.segid;
	}
	return make(vaddr, size, XPMEM_PERMIT_MODE, (void *)0666, name);
}

/* Revokes what attachers of [lo, hi) map: every backing mapped there that was handed out is
 * left by all our mappings of it (their pages move to fresh memfds), then cut to zero length,
 * so its attachers see SIGBUS. table_lock held. */
static void revoke_range(uintptr_t lo, uintptr_t hi)
{
	size_t count;
	struct placement *inside = placements(lo, hi, &count);
	if (!inside)
		return;
	/* The backings to revoke, by inode (indices shift as backings are added and dropped). */
	ino_t *victims = malloc((count ? count : 1) * sizeof *victims);
	size_t nvictims = 0;
	for (size_t i = 0; victims && i < count; i++)
		if (backings[inside[i].backing].handed_out)
			victims[nvictims++] = backings[inside[i].backing].ino;
	free(inside);
	for (size_t v = 0; v < nvictims; v++) {
		size_t n;
		struct placement *where = placements(0, UINTPTR_MAX, &n);
		size_t index = SIZE_MAX;
		for (size_t b = 0; b < backing_count; b++)
			if (backings[b].ino == victims[v])
				index = b;
		if (!where || index == SIZE_MAX) {
			free(where);
			continue;
		}
		int kept_all = 1;
		for (size_t i = 0; i < n; i++) {
			if (where[i].backing != index)
				continue;
			int fd = move_to_memfd(where[i].start, where[i].end - where[i].start, where[i].prot);
			if (fd < 0 || add_backing(fd, where[i].end - where[i].start) < 0) {
				kept_all = fd >= 0; /* out of memory: attachers keep access rather than we lose data */
				if (fd >= 0)
					close(fd);
			}
		}
		free(where);
		if (!kept_all)
			continue;
		for (size_t b = 0; b < backing_count; b++) {
			if (backings[b].ino != victims[v])
				continue;
			if (ftruncate(backings[b].fd, 0) < 0) {
				/* a memfd can always be truncated unless sealed, and ours are not */
			}
			drop_backing(b);
			break;
		}
	}
	free(victims);
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
static void device_notify_forget(xpmem_segid_t segid)
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

EXPORT int xpmem_remove(xpmem_segid_t segid)
{
	if (use_device()) {
		int removed = (int)device_call(XPMEM_CMD_REMOVE, &segid);
		if (removed == 0)
			device_notify_forget(segid);
		return removed;
	}
	struct wire_answer answer;
	uint64_t args[] = { (uint64_t)segid };
	if (segid <= 0) {
		errno = EINVAL;
		return -1;
	}
	if (call(OP_REMOVE, args, 1, NULL, &answer) < 0)
		return -1;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < segment_count; i++) {
		if (segments[i].segid != segid)
			continue;
		prune_backings();
		revoke_range(segments[i].vaddr, segments[i].vaddr + segments[i].size);
		if (segments[i].notify_fd >= 0)
			close(segments[i].notify_fd);
		segments[i] = segments[--segment_count];
		break;
	}
	pthread_mutex_unlock(&table_lock);
	return 0;
}

EXPORT xpmem_apid_t xpmem_get(xpmem_segid_t segid, int flags, int permit_type, void *permit_value)
{
	(void)permit_value; /* ignored, as XPMEM's library does (Open MPI passes 0666) */
	if (use_device())
		return device_get_access(segid, flags, permit_type);
	if (permit_type != XPMEM_PERMIT_MODE || (flags != XPMEM_RDONLY && flags != XPMEM_RDWR) || segid <= 0) {
		errno = EINVAL;
		return -1;
	}
	struct wire_answer answer;
	uint64_t args[] = { (uint64_t)segid, (uint64_t)flags };
	if (call(OP_GET, args, 2, NULL, &answer) < 0)
		return -1;
	/* Another enclave's segment: serve, so that its removal can reach our attachments. Without
	 * the serving connection they would keep the old pages (documented in docs/xemem.md). */
	xpmem_apid_t apid = (xpmem_apid_t)answer.results[0];
	if (answer.results[2] & WIRE_GET_REVOKED_BY_MESSAGE) {
		ensure_serving();
		pthread_mutex_lock(&table_lock);
		if (grow((void **)&message_permits, &message_permit_capacity, message_permit_count, sizeof *message_permits) == 0)
			message_permits[message_permit_count++] = apid;
		pthread_mutex_unlock(&table_lock);
	}
	return apid;
}

/* A broker call whose one argument is a permit (release, signal); a non-positive apid is
 * EINVAL, as XPMEM's. */
static int permit_call(uint16_t op, xpmem_apid_t apid)
{
	if (apid <= 0) {
		errno = EINVAL;
		return -1;
	}
	struct wire_answer answer;
	uint64_t args[] = { (uint64_t)apid };
	return call(op, args, 1, NULL, &answer);
}

EXPORT int xpmem_release(xpmem_apid_t apid)
{
	if (use_device())
		return (int)device_call(XPMEM_CMD_RELEASE, &apid);
	pthread_mutex_lock(&table_lock);
	drop_parked(apid);
	forget_message_permit(apid);
	pthread_mutex_unlock(&table_lock);
	return permit_call(OP_RELEASE, apid);
}

/* Parked attachments. Mapping a run of a file costs a fault per page on first touch (4 KiB
 * pages: about 0.3 us each here, three times the read of the page); an analytics code that
 * attaches its simulation's data again at every step pays it every time. So a detach of an
 * attachment of 2 MiB or more moves its mapping, page tables and all, out of the application's
 * sight (mremap to a place of its own: the page-directory entries move, not the pages') and
 * keeps it; an attach through the same permit of the same range, whose owner answers with the
 * same runs (same files, offsets and lengths: the owner's memory is still the same), hands the
 * kept mapping out again instead of mapping the runs anew. The owner is asked every time, as
 * before: only the mapping is kept. The detached address is unmapped (SIGSEGV), as XPMEM's;
 * a release, a revoke and fork (MADV_DONTFORK) drop parked mappings; at most PARKED_KEPT are
 * kept, the oldest going first. Caller holds table_lock. */
#define PARKED_KEPT 8
static uint64_t parked_count_ever;

static void forget_attachment(size_t index, int unmap)
{
	struct attachment *a = &attachments[index];
	if (unmap)
		munmap((void *)a->base, a->size);
	free(a->runs);
	attachments[index] = attachments[--attachment_count];
}

static void drop_parked(xpmem_apid_t apid)
{
	for (size_t i = attachment_count; i-- > 0;)
		if (attachments[i].parked && attachments[i].apid == apid)
			forget_attachment(i, 1);
}

static void *reserve(size_t len);

/* Moves attachment `a`'s mapping, page tables and all, to `to`: one mremap per run, each being
 * a mapping of its own (mremap moves one at a time). 0, or -1 with errno once a run could not
 * move (the runs before it are at `to`, the others where they were). */
static int move_runs(const struct attachment *a, char *to)
{
	uint64_t at = 0;
	for (uint32_t i = 0; i < a->nruns; i++) {
		if (mremap((char *)a->base + at, a->runs[i].length, a->runs[i].length, MREMAP_MAYMOVE | MREMAP_FIXED, to + at) ==
		    MAP_FAILED)
			return -1;
		at += a->runs[i].length;
	}
	return 0;
}

/* Moves attachment `index` out of sight and keeps it; 0 when it is parked, -1 when it could
 * not be (what is left of it at its address is the caller's to unmap). */
static int park_attachment(size_t index)
{
	struct attachment *a = &attachments[index];
	char *park = reserve(a->size);
	if (park == MAP_FAILED)
		return -1;
	if (move_runs(a, park) < 0) {
		munmap(park, a->size); /* the runs moved so far; the caller unmaps the rest */
		return -1;
	}
	a->base = (uintptr_t)park;
	a->parked = 1;
	a->parked_order = ++parked_count_ever;
	size_t parked = 0, oldest = index;
	for (size_t i = 0; i < attachment_count; i++) {
		if (!attachments[i].parked)
			continue;
		parked++;
		if (attachments[i].parked_order < attachments[oldest].parked_order)
			oldest = i;
	}
	if (parked > PARKED_KEPT)
		forget_attachment(oldest, 1);
	return 0;
}

/* The identities of an answer's runs (none when one is a hole or a file cannot be looked at);
 * returns how many, 0 for none. */
static uint32_t run_identities(const struct wire_run *runs, uint32_t nruns, const int *fds, struct run_identity **out)
{
	*out = NULL;
	struct run_identity *ids = calloc(nruns ? nruns : 1, sizeof *ids);
	if (!ids)
		return 0;
	for (uint32_t i = 0; i < nruns; i++) {
		struct stat st;
		if (runs[i].fd_index == WIRE_HOLE || fstat(fds[runs[i].fd_index], &st) < 0) {
			free(ids);
			return 0;
		}
		ids[i] = (struct run_identity){ st.st_dev, st.st_ino, runs[i].offset, runs[i].length };
	}
	*out = ids;
	return nruns;
}

/* The parked attachment of `apid` that maps [offset, offset + len) with exactly these runs;
 * parked ones of `apid` that do not are dropped (the owner's memory changed). Returns its
 * index, or -1. */
static long take_parked(xpmem_apid_t apid, int64_t offset, size_t len, const struct run_identity *ids, uint32_t nids)
{
	long found = -1;
	for (size_t i = attachment_count; i-- > 0;) {
		struct attachment *a = &attachments[i];
		if (!a->parked || a->apid != apid)
			continue;
		if (found < 0 && nids && a->offset == offset && a->size == len && a->nruns == nids &&
		    !memcmp(a->runs, ids, nids * sizeof *ids))
			found = (long)i;
		else
			forget_attachment(i, 1);
	}
	/* forget_attachment moves the last entry into the hole: find it again. */
	if (found >= 0) {
		for (size_t i = 0; i < attachment_count; i++)
			if (attachments[i].parked && attachments[i].apid == apid)
				return (long)i;
	}
	return -1;
}

static int hole_descriptor(void)
{
	/* An empty memfd: any page mapped from it lies beyond its end, so touching it is SIGBUS. */
	if (hole_fd < 0)
		hole_fd = memfd_create("xemem-hole", MFD_CLOEXEC);
	return hole_fd;
}

static int overlaps_attachment(uintptr_t lo, uintptr_t hi)
{
	for (size_t i = 0; i < attachment_count; i++)
		if (attachments[i].base < hi && lo < attachments[i].base + attachments[i].size)
			return 1;
	return 0;
}

/* Reserves len bytes of address space, 2 MiB-aligned when len allows, so hugetlb runs map. */
static void *reserve(size_t len)
{
	size_t align = len >= HUGE_PAGE ? HUGE_PAGE : PAGE;
	size_t padded = len + align - PAGE;
	char *raw = mmap(NULL, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED)
		return MAP_FAILED;
	uintptr_t base = ((uintptr_t)raw + align - 1) & ~(align - 1);
	if (base > (uintptr_t)raw)
		munmap(raw, base - (uintptr_t)raw);
	uintptr_t end = (uintptr_t)raw + padded;
	if (end > base + len)
		munmap((void *)(base + len), end - (base + len));
	return (void *)base;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* CLOWDER_XEMEM_PREFAULT=1: attach maps every page at once (default: lazily, on first touch,
 * as XPMEM does locally). */
static int prefault_requested(void)
{
	const char *value = getenv("CLOWDER_XEMEM_PREFAULT");
	return value && value[0] == '1';
}

EXPORT void *xpmem_attach(struct xpmem_addr addr, size_t size, void *vaddr)
{
	if (use_device())
		return device_attach_segment(addr, size, vaddr);
	uintptr_t fixed = (uintptr_t)vaddr;
	if (addr.offset < 0 || addr.offset % PAGE || fixed % PAGE || size == 0 || size > USER_LIMIT || addr.apid <= 0) {
		errno = EINVAL;
		return (void *)-1;
	}
	size_t len = (size + PAGE - 1) & ~(PAGE - 1);
	if (fixed && (fixed + len < fixed || fixed + len > USER_LIMIT)) {
		errno = EINVAL;
		return (void *)-1;
	}
	static struct wire_run runs[WIRE_MAX_RUNS];
	int fds[WIRE_MAX_FDS], nfds = 0;
	struct wire_request request = { .op = OP_ATTACH, .args = { (uint64_t)addr.apid, (uint64_t)addr.offset, len } };
	struct wire_answer answer;
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&call_lock);
	if (call_locked(&request, 0, &answer, runs, fds, &nfds) < 0) {
		int saved = errno;
		pthread_mutex_unlock(&call_lock);
		errno = saved;
		return (void *)-1;
	}
	/* runs is static: keep call_lock until they are mapped. */
	int error = 0;
	uint64_t total = 0;
	for (uint32_t i = 0; i < answer.runs; i++) {
		total += runs[i].length;
		if (runs[i].fd_index != WIRE_HOLE && runs[i].fd_index >= (uint32_t)nfds)
			error = EPROTO;
	}
	if (total != len)
		error = EPROTO;
	pthread_mutex_lock(&table_lock);
	if (!error && fixed && overlaps_attachment(fixed, fixed + len))
		error = EINVAL;
	if (!error && fixed) {
		/* Nor over exported memory of our own (XPMEM refuses a self attach over its source):
		 * MAP_FIXED would silently replace the very pages being attached. */
		size_t mine;
		struct placement *own = placements(fixed, fixed + len, &mine);
		if (mine > 0)
			error = EINVAL;
		free(own);
	}
	/* The runs' identities: a parked attachment of the same runs is handed out again. */
	struct run_identity *ids = NULL;
	uint32_t nids = !error && len >= HUGE_PAGE ? run_identities(runs, answer.runs, fds, &ids) : 0;
	long parked = nids ? take_parked(addr.apid, addr.offset, len, ids, nids) : -1;
	char *base = MAP_FAILED;
	if (!error && parked >= 0) {
		struct attachment *a = &attachments[parked];
		if (fixed && fixed != a->base) {
			/* Moved to the address asked for, run by run as it was parked. */
			if (move_runs(a, (char *)fixed) < 0)
				error = errno ? errno : ENOMEM;
			if (error) {
				forget_attachment((size_t)parked, 1);
				mmap((void *)fixed, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			} else {
				a->base = fixed;
			}
		}
		if (!error) {
			a->parked = 0;
			base = (char *)a->base;
		}
		free(ids);
		pthread_mutex_unlock(&table_lock);
		close_all(fds, nfds);
		if (error)
			goto undo;
		pthread_mutex_unlock(&call_lock);
		return base;
	}
	if (!error) {
		base = fixed ? (char *)fixed : reserve(len);
		if (base == MAP_FAILED)
			error = ENOMEM;
	}
	uint64_t at = 0;
	for (uint32_t i = 0; i < answer.runs && !error; i++) {
		int fd = runs[i].fd_index == WIRE_HOLE ? hole_descriptor() : fds[runs[i].fd_index];
		off_t offset = runs[i].fd_index == WIRE_HOLE ? 0 : (off_t)runs[i].offset;
		if (fd < 0 || mmap(base + at, runs[i].length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, offset) ==
				      MAP_FAILED)
			error = errno ? errno : ENOMEM;
		at += runs[i].length;
	}
	if (!error) {
		/* XPMEM attachments are VM_DONTCOPY: a forked child does not have them. */
		madvise(base, len, MADV_DONTFORK);
		if (prefault_requested()) {
			/* Map every page now, in one pass per run, instead of one fault per page later
			 * (XEMEM's cross-enclave attach is eager too). Holes stay unmapped. */
			uint64_t run_at = 0;
			for (uint32_t i = 0; i < answer.runs; i++) {
				if (runs[i].fd_index != WIRE_HOLE)
					madvise(base + run_at, runs[i].length, MADV_POPULATE_WRITE);
				run_at += runs[i].length;
			}
		}
		if (grow((void **)&attachments, &attachment_capacity, attachment_count, sizeof *attachments) < 0)
			error = ENOMEM;
		else {
			attachments[attachment_count++] = (struct attachment){
				.base = (uintptr_t)base, .size = len, .apid = addr.apid, .offset = addr.offset, .runs = ids, .nruns = nids
			};
			ids = NULL;
		}
	}
	free(ids);
	if (error && base != MAP_FAILED) {
		if (fixed)
			mmap(base, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		else
			munmap(base, len);
	}
	pthread_mutex_unlock(&table_lock);
	close_all(fds, nfds);
undo:
	if (error) {
		/* The broker counted the attachment; take it back. */
		struct wire_request undo = { .op = OP_DETACH, .args = { (uint64_t)addr.apid } };
		call_locked(&undo, 0, &answer, NULL, NULL, NULL);
	}
	pthread_mutex_unlock(&call_lock);
	if (error) {
		errno = error;
		return (void *)-1;
	}
	return base;
}

EXPORT int xpmem_detach(void *vaddr)
{
	if (use_device()) {
		uint64_t address = (uintptr_t)vaddr;
		return (int)device_call(XPMEM_CMD_DETACH, &address);
	}
	uintptr_t addr = (uintptr_t)vaddr;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < attachment_count; i++) {
		struct attachment a = attachments[i];
		if (a.parked || addr < a.base || addr >= a.base + a.size)
			continue;
		if (!a.nruns || park_attachment(i) < 0)
			forget_attachment(i, 1);
		pthread_mutex_unlock(&table_lock);
		struct wire_answer answer;
		uint64_t args[] = { (uint64_t)a.apid };
		call(OP_DETACH, args, 1, NULL, &answer); /* bookkeeping only: the mapping is gone */
		return 0;
	}
	pthread_mutex_unlock(&table_lock);
	/* Not an attachment: nothing mapped there is fine, anything else is EINVAL (as XPMEM). */
	if (msync((void *)(addr & ~(PAGE - 1)), PAGE, MS_ASYNC) < 0 && errno == ENOMEM)
		return 0;
	errno = EINVAL;
	return -1;
}

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

EXPORT int xemem_signal(xpmem_apid_t apid)
{
	if (use_device()) {
		struct xemem_cmd_signal signal = { .apid = apid };
		return (int)device_call(XEMEM_CMD_SIGNAL, &signal);
	}
	return permit_call(OP_SIGNAL, apid);
}

EXPORT int xemem_notify_fd(xpmem_segid_t segid)
{
	if (use_device()) {
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
