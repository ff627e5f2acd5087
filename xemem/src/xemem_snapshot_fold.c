/*
 * Folding a region's private view back into its memfd: the pages the writer stored into since
 * the last fold (its own, anonymous copies) are copied into the memfd through the side view,
 * then dropped from the view (whose next touch maps the memfd's page again), or the whole view
 * is mapped shared again. The cost is the pages written; the clean pages stay mapped.
 */
#include "xpmem_internal.h"

/* PAGEMAP_SCAN (Linux 6.7, <linux/fs.h>, which older headers lack): the runs of pages of a
 * range that have given properties, from the page tables, skipping empty ones wholesale. */
#define PAGEMAP_SCAN_IOCTL 0xc0606610UL /* _IOWR('f', 16, struct pm_scan_arg) */
enum { PAGE_IS_FILE = 1 << 2, PAGE_IS_PRESENT = 1 << 3, PAGE_IS_SWAPPED = 1 << 4 };
struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
struct page_region {
	uint64_t start, end, categories;
};
/* /proc/self/pagemap's entry bits, for kernels without PAGEMAP_SCAN. */
#define PM_PRESENT (1ULL << 63)
#define PM_SWAPPED (1ULL << 62)
#define PM_FILE (1ULL << 61)

/* Copies the writer's pages [start, end) of r's view into r's memfd, through the side view,
 * and, unless the whole view is to be mapped shared next, drops them from the view. The
 * memfd's pages there exist already (the kernel read each before copying it for the writer),
 * so nothing is allocated. A drop that fails (the range is mlocked) leaves a private page
 * equal to the memfd's: still the writer's own, so written back again by every later fold. */
static void write_back(const struct region *r, uintptr_t start, uintptr_t end, int share)
{
	memcpy(r->side + (start - r->base), (const void *)start, end - start);
	if (!share)
		madvise((void *)start, end - start, MADV_DONTNEED);
}

/* Writes back every page of r's view that is the writer's own (anonymous, present or swapped
 * out), not the memfd's, by PAGEMAP_SCAN; 1 when the kernel has none (ENOTTY), or
 * CLOWDER_XEMEM_PAGEMAP=read asks for the fallback (so that tests cover it). */
static int write_back_scanned(const struct region *r, int pagemap, int share)
{
	const char *forced = getenv("CLOWDER_XEMEM_PAGEMAP");
	if (forced && !strcmp(forced, "read"))
		return 1;
	struct page_region runs[256];
	uintptr_t at = r->base, end = r->base + r->size;
	while (at < end) {
		struct pm_scan_arg scan = {
			.size = sizeof scan, .start = at, .end = end, .vec = (uintptr_t)runs, .vec_len = 256,
			.category_inverted = PAGE_IS_FILE, .category_mask = PAGE_IS_FILE,
			.category_anyof_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED, .return_mask = PAGE_IS_PRESENT,
		};
		long n = ioctl(pagemap, PAGEMAP_SCAN_IOCTL, &scan);
		if (n < 0)
			return errno == ENOTTY ? 1 : -1;
		for (long i = 0; i < n; i++)
			write_back(r, runs[i].start, runs[i].end, share);
		if (scan.walk_end <= at) {
			errno = EIO;
			return -1;
		}
		at = scan.walk_end;
	}
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
	if (result == 1)
		result = write_back_read(r, pagemap, share);
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
	if (share)
		r->private_view = 0;
	return 0;
}
