/*
 * The process's mappings (/proc/self/maps, by PROCMAP_QUERY where the kernel has it) and
 * which parts of them may be converted in place.
 */
#include "xpmem_internal.h"

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
struct mapping *read_maps(uintptr_t lo, uintptr_t hi, size_t *count)
{
	return read_maps_with(lo, hi, 0, count);
}

static int special_mapping(const struct mapping *m)
{
	/* The main stack, and pages the kernel provides, are never converted. */
	return !strncmp(m->path, "[stack", 6) || !strcmp(m->path, "[vvar]") || !strcmp(m->path, "[vdso]") ||
	       !strcmp(m->path, "[vsyscall]") || !strncmp(m->path, "[vvar_vclock", 12);
}

int convertible(const struct mapping *m)
{
	return m->perms[0] == 'r' && m->perms[1] == 'w' && m->perms[3] == 'p' && !special_mapping(m);
}

int prot_of(const struct mapping *m)
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
uintptr_t service_stack_lo, service_stack_hi;

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

int convertible_parts(const struct mapping *m, uintptr_t start, uintptr_t end, uintptr_t parts[8][2])
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

/* The shared file mappings overlapping [lo, hi): where backings can be. */
struct mapping *read_shared_file_maps(uintptr_t lo, uintptr_t hi, size_t *count)
{
	return read_maps_with(lo, hi, QUERY_SHARED | QUERY_FILE_BACKED, count);
}
