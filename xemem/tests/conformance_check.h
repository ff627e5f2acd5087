/* What the two conformance programs share: conformance.c (cases between host processes) and
   cross.c (the two-party cases across enclaves). Each program defines fail(), which says which
   case failed where and exits 1; these are the checks built on it and the int-pattern memory
   the cases fill, attach and check. */
#ifndef CONFORMANCE_CHECK_H
#define CONFORMANCE_CHECK_H

#include <errno.h>
#include <stddef.h>
#include <sys/types.h>
#include <xpmem.h>

#include "fault_probe.h"

#define PAGE 4096UL
#define INTS_PER_PAGE (PAGE / sizeof(int))

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define CHECK(cond, ...)                                                                                              \
	do {                                                                                                          \
		if (!(cond))                                                                                          \
			fail(__VA_ARGS__);                                                                            \
	} while (0)

/* The call must fail with -1 and exactly this errno. */
#define EXPECT_ERROR(call, err)                                                                                       \
	do {                                                                                                          \
		errno = 0;                                                                                            \
		long long _r = (long long)(call);                                                                     \
		CHECK(_r == -1 && errno == (err), "%s: got %lld errno %d, want -1 errno %d", #call, _r, errno, err); \
	} while (0)

/* int[i] = base + i over `pages` pages. */
static void fill(int *p, size_t pages, int base)
{
	for (size_t i = 0; i < pages * INTS_PER_PAGE; i++)
		p[i] = base + (int)i;
}

static void expect_filled(const int *p, size_t pages, int base, const char *what)
{
	for (size_t i = 0; i < pages * INTS_PER_PAGE; i++)
		CHECK(p[i] == base + (int)i, "%s: int %zu is %d, want %d", what, i, p[i], base + (int)i);
}

/* Gets a read-write permit for `segid` and attaches `size` bytes from `offset`; the permit in
   *apid_out when that is not NULL. */
static void *attach_rw(xpmem_segid_t segid, off_t offset, size_t size, xpmem_apid_t *apid_out)
{
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid > 0, "xpmem_get %llx", (long long)segid);
	struct xpmem_addr addr = { .apid = apid, .offset = offset };
	void *p = xpmem_attach(addr, size, NULL);
	CHECK(p != (void *)-1, "xpmem_attach offset %lld size %zu", (long long)offset, size);
	if (apid_out)
		*apid_out = apid;
	return p;
}

/* The attacher's part of test_base: 4 pages of int[i] = i at `segid`, each int added 1 to.
   Returns the attachment. */
static int *attach_and_add_one(xpmem_segid_t segid)
{
	int *p = attach_rw(segid, 0, 4 * PAGE, NULL);
	expect_filled(p, 4, 0, "attacher");
	for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++)
		p[i] += 1;
	return p;
}

/* The attacher's part of test_two_attach: two permits for the 4 pages at `segid`, one
   attachment each, each adding 1; both are the same memory, and a detach by an inner address
   takes the whole first one. Returns the second attachment, still attached. */
static int *attach_twice_and_add_one(xpmem_segid_t segid)
{
	int *a = attach_rw(segid, 0, 4 * PAGE, NULL);
	int *b = attach_rw(segid, 0, 4 * PAGE, NULL);
	CHECK(a != b, "two distinct attachments");
	for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++) {
		a[i] += 1;
		b[i] += 1;
	}
	expect_filled(a, 4, 2, "the first attachment sees both writes");
	CHECK(xpmem_detach((char *)a + 5000) == 0, "detach by an inner address");
	CHECK(touch(a, 0) == SIGSEGV, "the detached range is gone");
	return b;
}

/* The attacher's part of the holes case: of the 15-page segment at `segid`, the owner mapped
   pages 3..12 (int[i] = i from page 3) but pages 7 and 8 before make and page 12 after.
   Every hole must raise SIGBUS, the rest read right. */
static void expect_holes(xpmem_segid_t segid)
{
	int *p = attach_rw(segid, 0, 15 * PAGE, NULL);
	for (int page = 0; page < 15; page++) {
		int hole = page < 3 || page == 7 || page == 8 || page == 12 || page >= 13;
		int *at = p + page * INTS_PER_PAGE;
		int sig = touch(at, 0);
		CHECK(sig == (hole ? SIGBUS : 0), "page %d: signal %d", page, sig);
		if (!hole)
			CHECK(*at == (int)((page - 3) * INTS_PER_PAGE), "page %d content", page);
	}
}

#endif
