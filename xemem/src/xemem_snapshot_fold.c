/*
 * Folding a region's private view back into its memfd: the pages the writer stored into since
 * the last fold are copied into the memfd through the side view. Two ways to find them:
 *  - tracked (Linux 6.7: userfaultfd's asynchronous write-protect, and PAGEMAP_SCAN's
 *    PAGE_IS_WRITTEN): the view starts write-protected; the kernel unprotects a page on the
 *    first store to it, without telling anybody; the fold's scan returns the unprotected pages,
 *    reading only page-table entries. Invariant: a protected page equals the memfd's. A writer
 *    mostly rewrites the same pages step after step, and a fault costs it about three times
 *    the page's copy (docs/results/xemem-snapshot.md), so a page that differs from the memfd's
 *    is copied and left writable: it costs a compare and a copy per fold, no fault. A page
 *    equal to the memfd's (not written since the last fold) is protected again, then compared
 *    once more (a store in between is copied or, after the protection, faults and is found by
 *    the next fold). That costs a syscall a run of such pages, dearer than the fault it saves
 *    when the written pages move from step to step; so a fold that finds half as many pages
 *    left writable for nothing as changed ones makes the next folds protect every written page
 *    again in the scan's walk itself, then copy them (a stretch of 4 folds, doubled, up to 64,
 *    each time the pages are seen moving again after it). The writer keeps its copies;
 *  - untracked (no userfaultfd, or an older kernel): the writer's own pages are told from the
 *    memfd's by their kind (anonymous), which makes the walk look at every mapped page, and
 *    are dropped from the view after the copy (its next touch maps the memfd's page again), so
 *    the next fold does not copy them again.
 * Either way the cost is the pages written plus a walk of the view's page table; the clean
 * pages stay mapped. CLOWDER_XEMEM_PAGEMAP=scan (untracked) or =read (untracked, from
 * /proc/self/pagemap, as before PAGEMAP_SCAN) choose a fallback, so that tests cover them.
 */
#include "xpmem_internal.h"

#include <linux/userfaultfd.h>
#include <sys/syscall.h>

/* PAGEMAP_SCAN (Linux 6.7, <linux/fs.h>, which older headers lack): the runs of pages of a
 * range that have given properties, from the page tables, skipping empty ones wholesale. */
#define PAGEMAP_SCAN_IOCTL 0xc0606610UL /* _IOWR('f', 16, struct pm_scan_arg) */
enum { PAGE_IS_WRITTEN = 1 << 1, PAGE_IS_FILE = 1 << 2, PAGE_IS_PRESENT = 1 << 3, PAGE_IS_SWAPPED = 1 << 4 };
enum { PM_SCAN_WP_MATCHING = 1 << 0, PM_SCAN_CHECK_WPASYNC = 1 << 1 };
struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
struct page_region {
	uint64_t start, end, categories;
};
/* userfaultfd's names that older headers lack. */
#define USER_MODE_ONLY 1
#define FEATURE_WP_HUGETLBFS_SHMEM (1ULL << 12)
#define FEATURE_WP_UNPOPULATED (1ULL << 13)
#define FEATURE_WP_ASYNC (1ULL << 15)
/* /proc/self/pagemap's entry bits, for kernels without PAGEMAP_SCAN. */
#define PM_PRESENT (1ULL << 63)
#define PM_SWAPPED (1ULL << 62)
#define PM_FILE (1ULL << 61)

/* The fallback CLOWDER_XEMEM_PAGEMAP asks for: "scan", "read", or NULL. */
static const char *forced_fallback(void)
{
	const char *forced = getenv("CLOWDER_XEMEM_PAGEMAP");
	return forced && (!strcmp(forced, "scan") || !strcmp(forced, "read")) ? forced : NULL;
}

/* Starts tracking the stores into r's view (just mapped private, so empty), write-protecting
 * all of it at once: WP_UNPOPULATED puts a marker in each empty entry (page tables for the
 * whole region, 2 MiB a GiB), since the fold's scan counts an entry with neither a page nor a
 * marker as written, and the first fold then copied, so allocated, every page of the region.
 * Without tracking (no userfaultfd, a kernel before 6.7, a fallback asked for) r->uffd stays
 * -1 and folds are untracked. region_lock held. */
void track_writes(struct region *r)
{
	if (forced_fallback())
		return;
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | USER_MODE_ONLY);
	if (uffd < 0)
		return;
	struct uffdio_api api = { .api = UFFD_API,
				  .features = FEATURE_WP_ASYNC | FEATURE_WP_UNPOPULATED | FEATURE_WP_HUGETLBFS_SHMEM };
	struct uffdio_register registration = { .range = { .start = r->base, .len = r->size },
						.mode = UFFDIO_REGISTER_MODE_WP };
	struct uffdio_writeprotect protect = { .range = registration.range, .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	if (ioctl(uffd, UFFDIO_API, &api) < 0 || ioctl(uffd, UFFDIO_REGISTER, &registration) < 0 ||
	    ioctl(uffd, UFFDIO_WRITEPROTECT, &protect) < 0) {
		close(uffd);
		return;
	}
	r->uffd = uffd;
}

/* Stops tracking r's view (mapped shared again, or going away). */
void untrack_writes(struct region *r)
{
	if (r->uffd >= 0)
		close(r->uffd);
	r->uffd = -1;
}

/* Copies the writer's pages [start, end) of r's view into r's memfd, through the side view,
 * and, unless `keep` (the whole view is mapped shared next), drops them. The
 * memfd's pages there exist already (the kernel read each before copying it for the writer),
 * so nothing is allocated. A drop that fails (the range is mlocked) leaves a private page
 * equal to the memfd's: still the writer's own, so written back again by every later fold. */
static void write_back(const struct region *r, uintptr_t start, uintptr_t end, int keep)
{
	memcpy(r->side + (start - r->base), (const void *)start, end - start);
	if (!keep)
		madvise((void *)start, end - start, MADV_DONTNEED);
}

/* Copies the pages of [start, end) of r's view that differ from the memfd's into it. */
static void copy_changed(const struct region *r, uintptr_t start, uintptr_t end)
{
	for (uintptr_t page = start; page < end; page += PAGE)
		if (memcmp((const void *)page, r->side + (page - r->base), PAGE))
			memcpy(r->side + (page - r->base), (const void *)page, PAGE);
}

/* Write-protects [start, end) of r's view, pages equal to the memfd's when compared, then
 * copies any a store changed meanwhile. A protection that fails leaves the pages writable,
 * which costs the next fold a compare, not correctness. */
static void protect_unchanged(const struct region *r, uintptr_t start, uintptr_t end)
{
	struct uffdio_writeprotect protect = { .range = { .start = start, .len = end - start },
					       .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	ioctl(r->uffd, UFFDIO_WRITEPROTECT, &protect);
	copy_changed(r, start, end);
}

/* Folds a run [start, end) of writable pages of a tracked view (see the top of this file):
 * the changed pages copied and left writable, the unchanged ones protected again, in runs;
 * with `share` nothing is protected (the view is mapped shared next). Counts the pages in
 * counted[0] (changed) and counted[1] (unchanged). */
static void fold_writable(const struct region *r, uintptr_t start, uintptr_t end, int share, size_t counted[2])
{
	uintptr_t unchanged = 0; /* start of the current run of unchanged pages, or 0 */
	for (uintptr_t page = start; page < end; page += PAGE) {
		char *side = r->side + (page - r->base);
		int same = !memcmp((const void *)page, side, PAGE);
		counted[same]++;
		if (same) {
			if (!unchanged)
				unchanged = page;
			continue;
		}
		memcpy(side, (const void *)page, PAGE);
		if (unchanged && !share)
			protect_unchanged(r, unchanged, page);
		unchanged = 0;
	}
	if (unchanged && !share)
		protect_unchanged(r, unchanged, end);
}

/* After a tracked fold that left changed pages writable (`kept`) and found counted[0] changed
 * and counted[1] unchanged, or one that protected them all: how the next folds go (see the top
 * of this file). */
static void choose_next_folds(struct region *r, int kept, const size_t counted[2])
{
	if (!kept) {
		r->stretch_ended = --r->protect_all == 0;
		return;
	}
	if (counted[1] && 2 * counted[1] >= counted[0]) {
		r->protect_all = 4u << r->moves;
		if (r->moves < 4)
			r->moves++;
	} else if (counted[0] && !r->stretch_ended) {
		r->moves = 0;
	}
	r->stretch_ended = 0;
}

/* Writes back the pages of r's view that PAGEMAP_SCAN finds: the writable ones (tracked), or
 * the writer's own (anonymous, present or swapped out: untracked).
 * 1 when the kernel has no PAGEMAP_SCAN (ENOTTY) or CLOWDER_XEMEM_PAGEMAP=read asks for the
 * fallback. */
static int write_back_scanned(struct region *r, int pagemap, int share)
{
	const char *forced = forced_fallback();
	if (forced && !strcmp(forced, "read"))
		return 1;
	int tracked = r->uffd >= 0, keep = tracked && !r->protect_all;
	size_t counted[2] = { 0, 0 };
	struct page_region runs[256];
	uintptr_t at = r->base, end = r->base + r->size;
	while (at < end) {
		struct pm_scan_arg scan = { .size = sizeof scan, .start = at, .end = end, .vec = (uintptr_t)runs, .vec_len = 256 };
		if (tracked) {
			scan.flags = PM_SCAN_CHECK_WPASYNC | (keep ? 0 : PM_SCAN_WP_MATCHING);
			scan.category_mask = scan.return_mask = PAGE_IS_WRITTEN;
		} else {
			scan.category_inverted = scan.category_mask = PAGE_IS_FILE;
			scan.category_anyof_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED;
			scan.return_mask = PAGE_IS_PRESENT;
		}
		long n = ioctl(pagemap, PAGEMAP_SCAN_IOCTL, &scan);
		if (n < 0)
			return errno == ENOTTY ? 1 : -1;
		for (long i = 0; i < n; i++)
			if (keep)
				fold_writable(r, runs[i].start, runs[i].end, share, counted);
			else
				write_back(r, runs[i].start, runs[i].end, share || tracked);
		if (scan.walk_end <= at) {
			errno = EIO;
			return -1;
		}
		at = scan.walk_end;
	}
	if (tracked && !share)
		choose_next_folds(r, keep, counted);
	return 0;
}

/* The same from /proc/self/pagemap's entries, 512 pages at a time. */
static int write_back_read(const struct region *r, int pagemap, int share)
{
	uint64_t entries[512];
	size_t pages = r->size / PAGE;
	uintptr_t run = 0; /* start of the current run of the writer's pages, or 0 */
	for (size_t first = 0; first < pages; first += 512) {
		size_t count = pages - first < 512 ? pages - first : 512;
		off_t at = (off_t)((r->base / PAGE + first) * sizeof *entries);
		if (pread(pagemap, entries, count * sizeof *entries, at) != (ssize_t)(count * sizeof *entries))
			return -1;
		for (size_t i = 0; i < count; i++) {
			uintptr_t page = r->base + (first + i) * PAGE;
			int own = (entries[i] & (PM_PRESENT | PM_SWAPPED)) && !(entries[i] & PM_FILE);
			if (own && !run)
				run = page;
			if (!own && run) {
				write_back(r, run, page, share);
				run = 0;
			}
		}
	}
	if (run)
		write_back(r, run, r->base + r->size, share);
	return 0;
}

/* Folds r's private view into its memfd (see the top of this file); with `share`, the view is
 * then mapped shared again, as xemem_region_alloc made it. 0, or -1 with errno (the view is
 * then as it was, its data intact). region_lock held. */
int fold(struct region *r, int share)
{
	int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pagemap < 0)
		return -1;
	int result = write_back_scanned(r, pagemap, share);
	if (result == 1) {
		/* No PAGEMAP_SCAN, so no asynchronous write-protect either: the pages' kinds. */
		untrack_writes(r);
		result = write_back_read(r, pagemap, share);
	}
	int saved = errno;
	close(pagemap);
	if (result == 0 && share &&
	    mmap((void *)r->base, r->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, r->fd, 0) == MAP_FAILED) {
		saved = errno;
		result = -1;
	}
	if (result < 0) {
		errno = saved ? saved : ENOMEM;
		return -1;
	}
	if (share) {
		untrack_writes(r);
		r->private_view = 0;
	}
	return 0;
}
