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

#endif
