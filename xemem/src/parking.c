/*
 * Attachment parking: detached attachments kept out of sight for a cheap re-attach, and the
 * address-space helpers attach shares with it.
 */
#include "xpmem_internal.h"

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

void forget_attachment(size_t index, int unmap)
{
	struct attachment *a = &attachments[index];
	if (unmap)
		munmap((void *)a->base, a->size);
	free(a->runs);
	attachments[index] = attachments[--attachment_count];
}

void drop_parked(xpmem_apid_t apid)
{
	for (size_t i = attachment_count; i-- > 0;)
		if (attachments[i].parked && attachments[i].apid == apid)
			forget_attachment(i, 1);
}

/* Moves attachment `a`'s mapping, page tables and all, to `to`: one mremap per run, each being
 * a mapping of its own (mremap moves one at a time). 0, or -1 with errno once a run could not
 * move (the runs before it are at `to`, the others where they were). */
int move_runs(const struct attachment *a, char *to)
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
int park_attachment(size_t index)
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
uint32_t run_identities(const struct wire_run *runs, uint32_t nruns, const int *fds, struct run_identity **out)
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
long take_parked(xpmem_apid_t apid, int64_t offset, size_t len, const struct run_identity *ids, uint32_t nids)
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

int hole_descriptor(void)
{
	/* An empty memfd: any page mapped from it lies beyond its end, so touching it is SIGBUS. */
	if (hole_fd < 0)
		hole_fd = memfd_create("xemem-hole", MFD_CLOEXEC);
	return hole_fd;
}

int overlaps_attachment(uintptr_t lo, uintptr_t hi)
{
	for (size_t i = 0; i < attachment_count; i++)
		if (attachments[i].base < hi && lo < attachments[i].base + attachments[i].size)
			return 1;
	return 0;
}

/* Reserves len bytes of address space, 2 MiB-aligned when len allows, so hugetlb runs map. */
void *reserve(size_t len)
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
