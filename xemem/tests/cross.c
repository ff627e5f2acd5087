/*
 * The XPMEM conformance cases that involve two parties, split into an owner and an attacher
 * that may run anywhere: host processes (libxpmem over clowderd's broker) or jobs in LWK
 * enclaves (/dev/xpmem). One static binary plays both roles:
 *
 *   cross owner CASE      exports what CASE needs and checks what the attacher did
 *   cross attacher CASE   attaches it and does CASE's part
 *   cross --list          the cases
 *
 * The two find each other through a one-page control segment the owner publishes under the
 * name "cross-CASE" (no fork, no sockets: an LWK job has neither); words in it carry segids
 * and steps. Each role prints "PASS CASE" or "FAIL CASE: why" last and exits 0 or 1.
 * node/clowderd/tests/xemem_lwk.rs runs every case host -> LWK, LWK -> host and LWK -> LWK.
 * The cases follow xemem/tests/conformance.c (which runs them between host processes).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#include "conformance_check.h"

#define STEP_SECONDS 60

/* Control page words. */
enum { SEG1, SEG2, SEG3, OWNER_STEP, ATTACHER_STEP };

static const char *current_case, *current_role;
static volatile uint64_t *ctl;

static void fail(const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	printf("FAIL %s (%s): ", current_case, current_role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (errno %d)\n", saved);
	exit(1);
}

/* Waits until the peer's step word reaches `step`. */
static void wait_step(int word, uint64_t step)
{
	time_t deadline = time(NULL) + STEP_SECONDS;
	while (ctl[word] < step) {
		CHECK(time(NULL) < deadline, "timed out waiting for step %llu of the peer", (unsigned long long)step);
		usleep(1000);
	}
}

/* Fresh private memory behind one read-only page: on the host a new anonymous mapping may
 * merge with a thread stack below it, which libxpmem never exports (docs/xemem.md, caveats);
 * the read-only page keeps every buffer a mapping of its own. */
static int *anonymous(size_t pages)
{
	char *p = mmap(NULL, (pages + 1) * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED && mprotect(p, PAGE, PROT_READ) == 0, "mmap");
	return (int *)(p + PAGE);
}

static xpmem_segid_t make(void *p, size_t pages, long mode)
{
	xpmem_segid_t segid = xpmem_make(p, pages * PAGE, XPMEM_PERMIT_MODE, (void *)mode);
	CHECK(segid > 0, "xpmem_make");
	return segid;
}

/* The owner's turn is over: tells the attacher so and waits until its turn is over too. */
static void hand_over(void)
{
	ctl[OWNER_STEP] = 1;
	wait_step(ATTACHER_STEP, 1);
}

/* Shares 4 pages of int[i] = i as SEG1 and, after the attacher's turn, expects
 * int[i] = i + added in them; removes the segment. */
static void share_and_expect(int added, const char *what)
{
	int *p = anonymous(4);
	fill(p, 4, 0);
	xpmem_segid_t segid = make(p, 4, 0666);
	ctl[SEG1] = segid;
	hand_over();
	expect_filled(p, 4, added, what);
	CHECK(xpmem_remove(segid) == 0, "remove");
}

/* ---- cases: each has an owner part and an attacher part ---- */

/* test_base: 4 pages of int[i] = i; the attacher adds 1 everywhere. */
static void base_owner(void)
{
	share_and_expect(1, "owner after the attacher added 1");
}

static void base_attacher(void)
{
	CHECK(xpmem_detach(attach_and_add_one(ctl[SEG1])) == 0, "detach");
}

/* test_two_attach with two permits (a bridged permit holds one attachment at a time): both
 * attachments are the same memory; a detach by an inner address takes the whole first one. */
static void two_attach_owner(void)
{
	share_and_expect(2, "owner after two attachments added 1 each");
}

static void two_attach_attacher(void)
{
	CHECK(xpmem_detach(attach_twice_and_add_one(ctl[SEG1])) == 0, "detach");
}

/* test_two_shares: two segments, both incremented. */
static void two_shares_owner(void)
{
	int *p = anonymous(4), *q = anonymous(4);
	fill(p, 4, 0);
	fill(q, 4, 100000);
	xpmem_segid_t s1 = make(p, 4, 0666), s2 = make(q, 4, 0666);
	CHECK(s1 != s2, "distinct segids");
	ctl[SEG1] = s1;
	ctl[SEG2] = s2;
	hand_over();
	expect_filled(p, 4, 1, "first segment");
	expect_filled(q, 4, 100001, "second segment");
	CHECK(xpmem_remove(s1) == 0 && xpmem_remove(s2) == 0, "remove");
}

static void two_shares_attacher(void)
{
	int *a = attach_rw(ctl[SEG1], 0, 4 * PAGE, NULL), *b = attach_rw(ctl[SEG2], 0, 4 * PAGE, NULL);
	expect_filled(b, 4, 100000, "second segment");
	for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++) {
		a[i] += 1;
		b[i] += 1;
	}
}

/* Holes: a 15-page segment of which pages 3..12 are mapped, with pages 7 and 8 unmapped
 * before make and page 12 after: every hole raises SIGBUS, the rest reads right. */
static void holes_owner(void)
{
	char *area = (char *)anonymous(15);
	int *p = (int *)(area + 3 * PAGE);
	fill(p, 10, 0);
	CHECK(munmap(area, 3 * PAGE) == 0 && munmap(area + 7 * PAGE, 2 * PAGE) == 0 && munmap(area + 13 * PAGE, 2 * PAGE) == 0, "munmap");
	xpmem_segid_t segid = make(area, 15, 0666);
	CHECK(munmap(area + 12 * PAGE, PAGE) == 0, "munmap after make");
	ctl[SEG1] = segid;
	hand_over();
	CHECK(xpmem_remove(segid) == 0, "remove");
}

static void holes_attacher(void)
{
	expect_holes(ctl[SEG1]);
}

/* After remove, reads and writes through the attachment raise SIGBUS; the owner keeps its
 * data and may write it. */
static void remove_owner(void)
{
	int *p = anonymous(8);
	fill(p, 8, 0);
	xpmem_segid_t segid = make(p, 8, 0666);
	ctl[SEG1] = segid;
	hand_over();
	CHECK(xpmem_remove(segid) == 0, "remove");
	expect_filled(p, 8, 0, "owner data after remove");
	p[0] = 77;
	CHECK(p[0] == 77, "owner write after remove");
	ctl[OWNER_STEP] = 2;
	wait_step(ATTACHER_STEP, 2);
}

static void remove_attacher(void)
{
	int *p = attach_rw(ctl[SEG1], 0, 8 * PAGE, NULL);
	expect_filled(p, 8, 0, "before remove");
	ctl[ATTACHER_STEP] = 1;
	wait_step(OWNER_STEP, 2);
	/* The remove returned only after every attachment elsewhere was revoked. */
	CHECK(touch(p, 0) == SIGBUS, "read after remove");
	CHECK(touch(p + 7 * INTS_PER_PAGE, 1) == SIGBUS, "write after remove");
	CHECK(xpmem_detach(p) == 0, "detach still works");
}

/* The owner exits without a remove: the attachment raises SIGBUS and the segid is gone. */
static void owner_exit_owner(void)
{
	int *p = anonymous(8);
	fill(p, 8, 0);
	ctl[SEG1] = make(p, 8, 0666);
	hand_over();
	printf("PASS owner_exit_sigbus (owner: exits without a remove)\n");
	fflush(stdout);
	_exit(0);
}

static void owner_exit_attacher(void)
{
	xpmem_segid_t segid = ctl[SEG1];
	int *p = attach_rw(segid, 0, 8 * PAGE, NULL);
	expect_filled(p, 8, 0, "before exit");
	ctl[ATTACHER_STEP] = 1;
	/* Neither the control page nor this attachment outlives the owner: no more ctl. The
	 * owner's end takes a moment to reach the name server. */
	int sig = 0;
	for (int i = 0; i < 1000 && sig != SIGBUS; i++) {
		sig = touch(p, 0);
		if (sig != SIGBUS)
			usleep(10000);
	}
	CHECK(sig == SIGBUS, "touch after the owner exited: signal %d", sig);
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
}

/* Access patterns over 1, 100 and 10,000 pages: sequential and sparse reads of what the owner
 * wrote, reverse writes, random reads of those (a full-period permutation), and the owner
 * reading the attacher's writes. */
static const long pattern_sizes[] = { 1, 100, 10000 };

static void patterns_owner(void)
{
	int *p[3];
	for (int n = 0; n < 3; n++) {
		p[n] = anonymous(pattern_sizes[n]);
		for (long i = 0; i < pattern_sizes[n]; i++)
			p[n][i * INTS_PER_PAGE] = (int)i;
		ctl[SEG1 + n] = make(p[n], pattern_sizes[n], 0666);
	}
	hand_over();
	for (int n = 0; n < 3; n++) {
		for (long i = 0; i < pattern_sizes[n]; i++)
			CHECK(p[n][i * INTS_PER_PAGE + 1] == (int)(i * 3), "owner reads page %ld of %ld", i, pattern_sizes[n]);
		CHECK(xpmem_remove(ctl[SEG1 + n]) == 0, "remove");
	}
}

static void patterns_attacher(void)
{
	for (int n = 0; n < 3; n++) {
		long pages = pattern_sizes[n];
		int *p = attach_rw(ctl[SEG1 + n], 0, pages * PAGE, NULL);
		for (long i = 0; i < pages; i++)
			CHECK(p[i * INTS_PER_PAGE] == i, "sequential page %ld of %ld", i, pages);
		for (long i = pages - 1; i >= 0; i--)
			p[i * INTS_PER_PAGE + 1] = (int)(i * 3);
		/* i -> (a * i + c) mod pages with c coprime to pages and a - 1 divisible by every
		 * prime factor of pages (and by 4): a full period. */
		long a = 4 * 5 + 1, c = 7919, i = 0;
		for (long visited = 0; visited < pages; visited++) {
			i = (a * i + c) % pages;
			CHECK(p[i * INTS_PER_PAGE + 1] == (int)(i * 3), "random page %ld of %ld", i, pages);
		}
		for (long j = 0; j < pages; j += 200)
			CHECK(p[j * INTS_PER_PAGE] == j, "sparse page %ld of %ld", j, pages);
	}
}

/* Permissions as "others": the attacher on the host drops to uid 65534 first, so only the other
 * bits count: 0600 refuses both, 0644 gives RDONLY but not RDWR, 0666 gives both, and a RDONLY
 * permit cannot attach (EACCES, as XPMEM). An enclave's processes act as the enclave's owner,
 * root in these tests, whom no mode refuses: there only the RDONLY attach is refused. */
static int attacher_in_enclave;

static void permissions_owner(void)
{
	static const long modes[] = { 0600, 0644, 0666 };
	for (int n = 0; n < 3; n++)
		ctl[SEG1 + n] = make(anonymous(1), 1, modes[n]);
	hand_over();
	for (int n = 0; n < 3; n++)
		CHECK(xpmem_remove(ctl[SEG1 + n]) == 0, "remove");
}

static void permissions_attacher(void)
{
	if (attacher_in_enclave) {
		int *own = attach_rw(ctl[SEG1], 0, PAGE, NULL);
		own[0] = 6;
		CHECK(xpmem_detach(own) == 0, "detach");
	} else {
		EXPECT_ERROR(xpmem_get(ctl[SEG1], XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EACCES);
		EXPECT_ERROR(xpmem_get(ctl[SEG1], XPMEM_RDONLY, XPMEM_PERMIT_MODE, NULL), EACCES);
		EXPECT_ERROR(xpmem_get(ctl[SEG2], XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EACCES);
	}
	xpmem_apid_t readonly = xpmem_get(ctl[SEG2], XPMEM_RDONLY, XPMEM_PERMIT_MODE, NULL);
	CHECK(readonly > 0, "RDONLY get of a 0644 segment");
	struct xpmem_addr addr = { .apid = readonly, .offset = 0 };
	EXPECT_ERROR(xpmem_attach(addr, PAGE, NULL), EACCES);
	CHECK(xpmem_release(readonly) == 0, "release");
	int *p = attach_rw(ctl[SEG3], 0, PAGE, NULL);
	p[0] = 5;
	CHECK(xpmem_detach(p) == 0, "detach");
}

/* Argument errors across the link: unknown ids ENOENT, bad flags and ranges EINVAL. */
static void id_errors_owner(void)
{
	ctl[SEG1] = make(anonymous(4), 4, 0666);
	hand_over();
	CHECK(xpmem_remove(ctl[SEG1]) == 0, "remove");
}

static void id_errors_attacher(void)
{
	xpmem_segid_t segid = ctl[SEG1];
	xpmem_segid_t unknown = (segid & ~0xffffffffLL) | 0x7ffffff0;
	EXPECT_ERROR(xpmem_get(unknown, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
	EXPECT_ERROR(xpmem_get(segid, 9999, XPMEM_PERMIT_MODE, NULL), EINVAL);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid > 0, "get");
	struct xpmem_addr misaligned = { .apid = apid, .offset = 100 };
	EXPECT_ERROR(xpmem_attach(misaligned, PAGE, NULL), EINVAL);
	struct xpmem_addr beyond = { .apid = apid, .offset = 4 * PAGE };
	EXPECT_ERROR(xpmem_attach(beyond, PAGE, NULL), EINVAL);
	struct xpmem_addr straddling = { .apid = apid, .offset = 3 * PAGE };
	EXPECT_ERROR(xpmem_attach(straddling, 2 * PAGE, NULL), EINVAL);
	EXPECT_ERROR(xpmem_release((1LL << 32) | 0xfffffff0LL), ENOENT); /* a well-formed apid nobody holds */
	CHECK(xpmem_release(apid) == 0, "release");
	EXPECT_ERROR(xpmem_release(apid), ENOENT);
}

struct cross_case {
	const char *name;
	void (*owner)(void);
	void (*attacher)(void);
};

static const struct cross_case cases[] = {
	{ "base", base_owner, base_attacher },
	{ "two_attach", two_attach_owner, two_attach_attacher },
	{ "two_shares", two_shares_owner, two_shares_attacher },
	{ "holes_sigbus", holes_owner, holes_attacher },
	{ "remove_sigbus", remove_owner, remove_attacher },
	{ "owner_exit_sigbus", owner_exit_owner, owner_exit_attacher },
	{ "patterns", patterns_owner, patterns_attacher },
	{ "permissions", permissions_owner, permissions_attacher },
	{ "id_errors", id_errors_owner, id_errors_attacher },
};

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--list") == 0) {
		for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
			printf("%s\n", cases[i].name);
		return 0;
	}
	const struct cross_case *which = NULL;
	for (size_t i = 0; argc == 3 && i < sizeof cases / sizeof cases[0]; i++)
		if (strcmp(argv[2], cases[i].name) == 0)
			which = &cases[i];
	int owner = argc == 3 && strcmp(argv[1], "owner") == 0;
	if (!which || (!owner && strcmp(argv[1], "attacher") != 0)) {
		fprintf(stderr, "usage: %s owner|attacher CASE | --list\n", argv[0]);
		return 2;
	}
	current_case = which->name;
	current_role = argv[1];
	setvbuf(stdout, NULL, _IOLBF, 0);
	char name[64];
	snprintf(name, sizeof name, "cross-%s", which->name);
	if (owner) {
		volatile uint64_t *page = (volatile uint64_t *)anonymous(1);
		ctl = page;
		xpmem_segid_t segid = xemem_make((void *)page, PAGE, name);
		CHECK(segid > 0, "xemem_make %s", name);
		which->owner();
		CHECK(xpmem_remove(segid) == 0, "remove the control segment");
	} else {
		int device = open("/dev/xpmem", O_RDWR);
		if (device >= 0)
			close(device);
		attacher_in_enclave = device >= 0;
		if (strcmp(which->name, "permissions") == 0 && getuid() == 0 && device < 0) {
			/* On the host (an enclave has /dev/xpmem, and its processes are others anyway):
			 * be nobody before the library connects to the broker, which keeps the
			 * credentials of the connection. */
			CHECK(setgid(65534) == 0 && setuid(65534) == 0, "setuid 65534");
		}
		xpmem_segid_t segid = -1;
		time_t deadline = time(NULL) + STEP_SECONDS;
		while ((segid = xemem_lookup_segid(name)) <= 0) {
			CHECK(time(NULL) < deadline, "no segment named %s", name);
			usleep(20000);
		}
		ctl = attach_rw(segid, 0, PAGE, NULL);
		wait_step(OWNER_STEP, 1);
		which->attacher();
		/* Done: the owner checks (the owner of owner_exit_sigbus is gone, and its page). */
		if (strcmp(which->name, "owner_exit_sigbus") != 0)
			ctl[ATTACHER_STEP] += 1;
	}
	printf("PASS %s (%s)\n", which->name, current_role);
	return 0;
}
