/* Getting, attaching and checking a segment read-write, for the test programs that attach
   one (host processes and LWK jobs). Get and attach are separate steps, since some programs
   check the permit in between. A failure prints "get failed: errno N" or "attach failed:
   errno N", and the program exits with GET_FAILED or ATTACH_FAILED: clowderd's tests look
   for both. */
#ifndef ATTACH_SEGMENT_H
#define ATTACH_SEGMENT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <xpmem.h>
#include "named_segment.h"
#include "patterned_segment.h"

enum { GET_FAILED = 2, ATTACH_FAILED = 3 };

/* A read-write permit for `segid`, or -1 after printing "get failed: errno N". */
static xpmem_apid_t get_segment(xpmem_segid_t segid)
{
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0) {
		printf("get failed: errno %d\n", errno);
		return -1;
	}
	return apid;
}

/* Waits for the segment `name` (at most `tries` lookups), prints "found a segment of enclave
   N" and gets a read-write permit for it into *apid: 0, or the program's exit code after
   printing what failed (1 when there is no such segment, else GET_FAILED). */
static inline int get_named_segment(const char *name, int tries, xpmem_apid_t *apid)
{
	xpmem_segid_t segid = wait_for_named_segment(name, tries);
	if (segid <= 0)
		return 1;
	printf("found a segment of enclave %lld\n", (long long)(segid >> 32));
	*apid = get_segment(segid);
	return *apid <= 0 ? GET_FAILED : 0;
}

/* The first `size` bytes of the segment `apid` permits, attached; NULL after printing
   "attach failed: errno N" and, when the library has one, "because: REASON". */
static void *attach_segment(xpmem_apid_t apid, size_t size)
{
	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	void *view = xpmem_attach(address, size, NULL);
	if (view == (void *)-1) {
		int error = errno;
		const char *why = xemem_errmsg();
		printf("attach failed: errno %d\n", error);
		if (why)
			printf("because: %s\n", why);
		return NULL;
	}
	return view;
}

/* The first `pages` pages (4096 bytes each) `apid` permits, attached, with how many start with
   the owner's pattern from `base` in *matching, printed as "M of N pages hold WHAT"; NULL as
   attach_segment. */
static inline volatile uint64_t *attach_and_check(xpmem_apid_t apid, int pages, uint64_t base, const char *what,
						  int *matching)
{
	volatile uint64_t *view = attach_segment(apid, pages * 4096UL);
	if (!view)
		return NULL;
	*matching = pages_with_pattern(view, pages, base);
	printf("%d of %d pages hold %s\n", *matching, pages, what);
	return view;
}

#endif
