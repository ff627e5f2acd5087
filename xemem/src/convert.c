/*
 * In-place conversion: private writable memory moved onto memfds at the same addresses,
 * writers parked meanwhile, and the converted backings kept (pruned, looked up).
 */
#include "xpmem_internal.h"

/* The range being converted: writers fault (it is read-only meanwhile) and wait here. */
static _Atomic uintptr_t converting_lo, converting_hi;
/* Set while a fork's child copies the converted memory: every backing is read-only then. */
_Atomic int frozen_for_fork;
/* The application's SIGSEGV disposition, which faults that are not ours go to. Our handler,
 * once installed, stays: removing it after a freeze could let a thread that faulted during the
 * freeze, but was delivered the signal only later, die of the restored default action. */
static struct sigaction application_segv;
/* Bumped when a freeze (conversion or fork) starts and when it ends. A thread may fault on
 * frozen memory yet run its handler only after the freeze ended (it was preempted in
 * between), when nothing says the fault was ours. So a fault that looks foreign is retried
 * once; only a fault that repeats at the same address with no freeze in between is real and
 * goes to the application's disposition. */
_Atomic uint64_t protection_epoch;
static __thread uintptr_t foreign_fault_at __attribute__((tls_model("initial-exec")));
static __thread uint64_t foreign_fault_epoch __attribute__((tls_model("initial-exec")));


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
void install_parking(void)
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

void guard_end(void)
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
void copy_nonzero_pages(char *dst, const char *src, size_t len)
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
int move_to_memfd(uintptr_t addr, size_t len, int prot)
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

int add_backing(int fd, size_t len)
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


struct backing *backing_for(unsigned major, unsigned minor, unsigned long inode)
{
	for (size_t i = 0; i < backing_count; i++)
		if (backings[i].ino == inode && major(backings[i].dev) == major && minor(backings[i].dev) == minor)
			return &backings[i];
	return NULL;
}

/* Where the backings are mapped now, within [lo, hi). Returns a malloc'd array. */
struct placement *placements(uintptr_t lo, uintptr_t hi, size_t *count)
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

void drop_backing(size_t index)
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
void prune_backings(void)
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
struct mapping *prepared_maps(uintptr_t lo, uintptr_t hi, size_t *count)
{
	prune_backings();
	struct mapping *maps = read_maps(lo, hi, count);
	if (convert_range(maps, *count, lo, hi)) {
		free(maps);
		maps = read_maps(lo, hi, count);
	}
	return maps;
}
