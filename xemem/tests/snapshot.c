/*
 * XEMEM snapshots (xemem_snapshot_make/_release over xemem_region_alloc regions) between host
 * processes: `snapshot CASE` exits 0 when the case holds; `snapshot --list` names them. The
 * writer is this process; readers are forked children that get and attach the snapshot as
 * any segment, and talk to the writer over a socketpair (one 8-byte word per step).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xpmem.h>

#include "conformance_check.h"
#include "named_cases.h"

#define PAGES 64


static void say(int fd, uint64_t word)
{
	CHECK(write(fd, &word, sizeof word) == sizeof word, "write to the peer");
}

static uint64_t hear(int fd)
{
	uint64_t word;
	CHECK(read(fd, &word, sizeof word) == sizeof word, "read from the peer (gone?)");
	return word;
}

/* Forks a reader running body(fd); the writer's end of their socketpair in *fd. */
static pid_t fork_reader(void (*body)(int fd), int *fd)
{
	int pair[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0, "socketpair");
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		close(pair[0]);
		body(pair[1]);
		exit(0);
	}
	close(pair[1]);
	*fd = pair[0];
	return pid;
}

static void reaped(pid_t pid)
{
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "reader %d ended with status %#x", pid, status);
}

/* The reader of the isolation case: attaches the snapshot it is told, checks it, waits while
 * the writer rewrites the region, checks it again, detaches. */
static void isolated_reader(int fd)
{
	xpmem_segid_t segid = (xpmem_segid_t)hear(fd);
	int *p = attach_rw(segid, 0, PAGES * PAGE, NULL);
	expect_filled(p, PAGES, 0, "the snapshot as attached");
	say(fd, 1);
	hear(fd); /* the writer has rewritten every page, and some twice */
	expect_filled(p, PAGES, 0, "the snapshot after the writer rewrote the region");
	CHECK(xpmem_detach(p) == 0, "detach");
	say(fd, 1);
}

/* A reader that attaches the segid it is told and checks the pattern base it is told. */
static void checking_reader(int fd)
{
	xpmem_segid_t segid = (xpmem_segid_t)hear(fd);
	int base = (int)hear(fd);
	int *p = attach_rw(segid, 0, PAGES * PAGE, NULL);
	expect_filled(p, PAGES, base, "a later snapshot");
	say(fd, 1);
}

/* A reader sees the snapshot unchanged while the writer rewrites the region; the writer sees
 * its own stores; after the release, the next snapshot has the writer's newer data (the
 * pages written under the snapshot were folded back, the others kept); the released segid is
 * gone. */
static int case_isolation(void)
{
	int *w = xemem_region_alloc(PAGES * PAGE);
	CHECK(w != (void *)-1, "xemem_region_alloc");
	fill(w, PAGES, 0);
	xpmem_segid_t segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(segid > 0, "xemem_snapshot_make");
	int fd;
	pid_t reader = fork_reader(isolated_reader, &fd);
	say(fd, (uint64_t)segid);
	hear(fd);
	fill(w, PAGES, 1000);
	fill(w + 3 * INTS_PER_PAGE, 1, 7000); /* one page twice */
	fill(w + 3 * INTS_PER_PAGE, 1, 1000 + 3 * INTS_PER_PAGE);
	say(fd, 1);
	hear(fd);
	reaped(reader);
	close(fd);
	expect_filled(w, PAGES, 1000, "the writer's own view under the snapshot");
	CHECK(xemem_snapshot_release(segid) == 0, "xemem_snapshot_release");
	expect_filled(w, PAGES, 1000, "the writer's view after the release");
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
	EXPECT_ERROR(xemem_snapshot_release(segid), ENOENT);

	/* Half the pages rewritten under the first snapshot only: the next one holds the rest. */
	xpmem_segid_t second = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(second > 0, "a second snapshot after the release");
	fill(w, PAGES / 2, 5); /* under the second: not in it */
	reader = fork_reader(checking_reader, &fd);
	say(fd, (uint64_t)second);
	say(fd, 1000);
	hear(fd);
	reaped(reader);
	close(fd);
	CHECK(xemem_snapshot_release(second) == 0, "release the second");
	expect_filled(w, PAGES / 2, 5, "the first half after the second release");
	expect_filled(w + PAGES / 2 * INTS_PER_PAGE, PAGES / 2, 1000 + PAGES / 2 * INTS_PER_PAGE, "the second half");

	/* Exported live after its snapshots: an attacher sees the writer's latest stores. */
	fill(w, PAGES, 77);
	xpmem_segid_t live = xpmem_make(w, PAGES * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(live > 0, "xpmem_make of the region after its snapshots");
	reader = fork_reader(checking_reader, &fd);
	say(fd, (uint64_t)live);
	say(fd, 77);
	hear(fd);
	reaped(reader);
	close(fd);
	CHECK(xpmem_remove(live) == 0, "remove the live segment");
	CHECK(xemem_region_free(w) == 0, "xemem_region_free");
	return 0;
}

/* Several readers at once, each attaching the snapshot (and one a part of it, from an offset)
 * while the writer rewrites the region twice: every reader sees the snapshot throughout. */
static int case_readers(void)
{
	enum { READERS = 3 };
	int *w = xemem_region_alloc(PAGES * PAGE);
	CHECK(w != (void *)-1, "xemem_region_alloc");
	fill(w, PAGES, 0);
	xpmem_segid_t segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(segid > 0, "xemem_snapshot_make");
	int fds[READERS];
	pid_t readers[READERS];
	for (int i = 0; i < READERS; i++) {
		readers[i] = fork_reader(isolated_reader, &fds[i]);
		say(fds[i], (uint64_t)segid);
	}
	int *part = attach_rw(segid, 8 * PAGE, 4 * PAGE, NULL); /* this process reads pages 8..11 */
	for (int i = 0; i < READERS; i++)
		hear(fds[i]);
	fill(w, PAGES, 2000);
	fill(w, PAGES, 3000);
	expect_filled(part, 4, 8 * INTS_PER_PAGE, "pages 8..11 of the snapshot, attached by the writer itself");
	for (int i = 0; i < READERS; i++) {
		say(fds[i], 1);
		hear(fds[i]);
		reaped(readers[i]);
		close(fds[i]);
	}
	CHECK(xpmem_detach(part) == 0, "detach the part");
	CHECK(xemem_snapshot_release(segid) == 0, "release");
	expect_filled(w, PAGES, 3000, "the writer's view");
	CHECK(xemem_region_free(w) == 0, "free");
	return 0;
}

/* A named snapshot is found by name; the name goes with the release. */
static int case_named(void)
{
	char name[48];
	snprintf(name, sizeof name, "snapshot-test-%d", getpid());
	int *w = xemem_region_alloc(PAGES * PAGE);
	CHECK(w != (void *)-1, "xemem_region_alloc");
	fill(w, PAGES, 9);
	xpmem_segid_t segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0666, name);
	CHECK(segid > 0, "named xemem_snapshot_make");
	CHECK(xemem_lookup_segid(name) == segid, "lookup finds the snapshot");
	int fd;
	pid_t reader = fork_reader(checking_reader, &fd);
	say(fd, (uint64_t)segid);
	say(fd, 9);
	hear(fd);
	reaped(reader);
	CHECK(xemem_snapshot_release(segid) == 0, "release");
	EXPECT_ERROR(xemem_lookup_segid(name), ENOENT);
	CHECK(xemem_region_free(w) == 0, "free");
	return 0;
}

/* This process's shared memory mapped (RssShmem), in KiB. */
static long shmem_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "RssShmem: %ld", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

/* A big region written sparsely: a snapshot copies the pages written, never the holes (the
 * kernel's scan counted empty entries as written: the first fold copied, and so allocated,
 * the whole region). */
static int case_sparse(void)
{
	size_t size = (size_t)1 << 30;
	char *w = xemem_region_alloc(size);
	CHECK(w != (void *)-1, "xemem_region_alloc of 1 GiB");
	w[0] = 1;
	w[size / 2] = 2;
	long before = shmem_kib();
	for (int i = 0; i < 3; i++) {
		xpmem_segid_t segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
		CHECK(segid > 0, "xemem_snapshot_make");
		CHECK(xemem_snapshot_release(segid) == 0, "release");
		w[(size_t)i * PAGE * 1000] = (char)(3 + i); /* under the released snapshot */
	}
	long grown = shmem_kib() - before;
	CHECK(before >= 0 && grown < 4096, "three snapshots of a sparse 1 GiB region mapped %ld KiB more", grown);
	CHECK(xemem_region_free(w) == 0, "free");
	return 0;
}

/* Whether this kernel tracks the view's stores (userfaultfd's asynchronous write-protect) and
 * CLOWDER_XEMEM_PAGEMAP asks for no fallback: then rewriting the same pages again costs no
 * fault. */
static int tracked(void)
{
	const char *forced = getenv("CLOWDER_XEMEM_PAGEMAP");
	if (forced && strcmp(forced, "tracked"))
		return 0;
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* USER_MODE_ONLY */);
	struct uffdio_api api = { .api = UFFD_API, .features = 1ULL << 15 /* WP_ASYNC */ };
	int ok = uffd >= 0 && ioctl(uffd, UFFDIO_API, &api) == 0;
	if (uffd >= 0)
		close(uffd);
	return ok;
}

static long minor_faults(void)
{
	struct rusage usage;
	CHECK(getrusage(RUSAGE_THREAD, &usage) == 0, "getrusage");
	return usage.ru_minflt;
}

/* Snapshots `pages` pages at w and checks the snapshot equals `expected`, through an
 * attachment of it in this process. */
static void expect_snapshot(const int *w, size_t pages, const int *expected, int cycle)
{
	xpmem_segid_t segid = xemem_snapshot_make((void *)w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(segid > 0, "xemem_snapshot_make, cycle %d", cycle);
	xpmem_apid_t apid;
	const int *p = attach_rw(segid, 0, pages * PAGE, &apid);
	for (size_t i = 0; i < pages * INTS_PER_PAGE; i++)
		CHECK(p[i] == expected[i], "cycle %d: the snapshot's int %zu (page %zu) is %d, want %d", cycle, i,
		      i / INTS_PER_PAGE, p[i], expected[i]);
	CHECK(xpmem_detach((void *)p) == 0 && xpmem_release(apid) == 0, "detach and release, cycle %d", cycle);
	CHECK(xemem_snapshot_release(segid) == 0, "xemem_snapshot_release, cycle %d", cycle);
}

/* Pages the writer rewrites at every snapshot are left writable by the fold (tracked: no fault
 * on their rewrite), yet every snapshot holds the writer's data at its make, whatever the
 * pattern: the same pages, the same contents rewritten, one int changed at a page's end, pages
 * that move from one snapshot to the next (the folds then protect every written page again)
 * and the same pages once more. */
static int case_kept(void)
{
	enum { KEPT_PAGES = 128, SAME = 16 };
	int *w = xemem_region_alloc(KEPT_PAGES * PAGE);
	CHECK(w != (void *)-1, "xemem_region_alloc");
	int *expected = calloc(KEPT_PAGES * INTS_PER_PAGE, sizeof *expected);
	CHECK(expected, "calloc");
	fill(w, KEPT_PAGES, 0);
	fill(expected, KEPT_PAGES, 0);
	int track = tracked(), cycle = 0;
	for (int c = 0; c < 6; c++, cycle++) { /* the same pages, rewritten whole */
		expect_snapshot(w, KEPT_PAGES, expected, cycle);
		long before = minor_faults();
		fill(w, SAME, 100 * (cycle + 1));
		long faults = minor_faults() - before;
		fill(expected, SAME, 100 * (cycle + 1));
		CHECK(!track || c < 2 || faults < SAME / 4, "cycle %d: rewriting %d pages left writable faulted %ld times",
		      cycle, SAME, faults);
	}
	int last = 100 * cycle; /* what the last cycle wrote */
	expect_snapshot(w, KEPT_PAGES, expected, cycle++);
	fill(w, SAME, last); /* the same contents: folded as unchanged */
	expect_snapshot(w, KEPT_PAGES, expected, cycle++);
	w[3 * INTS_PER_PAGE + INTS_PER_PAGE - 1] = expected[3 * INTS_PER_PAGE + INTS_PER_PAGE - 1] = -1;
	for (int c = 0; c < 40; c++, cycle++) { /* moving: a new set of pages at each snapshot */
		expect_snapshot(w, KEPT_PAGES, expected, cycle);
		size_t first = SAME + (size_t)(c % 7) * SAME;
		fill(w + first * INTS_PER_PAGE, SAME / 2, 1000 * cycle);
		fill(expected + first * INTS_PER_PAGE, SAME / 2, 1000 * cycle);
		w[(c % SAME) * INTS_PER_PAGE + 7] = expected[(c % SAME) * INTS_PER_PAGE + 7] = cycle;
	}
	for (int c = 0; c < 80; c++, cycle++) { /* the same pages again */
		expect_snapshot(w, KEPT_PAGES, expected, cycle);
		fill(w, SAME, 100000 * cycle);
		fill(expected, SAME, 100000 * cycle);
	}
	expect_snapshot(w, KEPT_PAGES, expected, cycle);
	for (size_t i = 0; i < KEPT_PAGES * INTS_PER_PAGE; i++)
		CHECK(w[i] == expected[i], "the writer's view: int %zu is %d, want %d", i, w[i], expected[i]);
	long before = minor_faults();
	fill(w, SAME, 7);
	CHECK(!track || minor_faults() - before < SAME / 4, "the same pages again: their rewrite faulted %ld times",
	      minor_faults() - before);
	CHECK(xemem_region_free(w) == 0, "free");
	free(expected);
	return 0;
}

/* Every misuse fails with its errno and changes nothing. */
static int case_errors(void)
{
	EXPECT_ERROR(xemem_region_alloc(0), EINVAL);
	int *w = xemem_region_alloc(PAGES * PAGE - 100); /* rounded up to pages */
	CHECK(w != (void *)-1, "xemem_region_alloc");
	fill(w, PAGES, 3);
	static char plain[PAGE] __attribute__((aligned(PAGE)));
	EXPECT_ERROR(xemem_snapshot_make(plain, XPMEM_PERMIT_MODE, (void *)0600, NULL), EINVAL);
	EXPECT_ERROR(xemem_snapshot_make(w + 1, XPMEM_PERMIT_MODE, (void *)0600, NULL), EINVAL);
	EXPECT_ERROR(xemem_snapshot_make(w, 7, (void *)0600, NULL), EINVAL);
	EXPECT_ERROR(xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)01777, NULL), EINVAL);
	EXPECT_ERROR(xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, ""), EINVAL);
	xpmem_segid_t segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(segid > 0, "xemem_snapshot_make");
	EXPECT_ERROR(xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL), EBUSY);
	EXPECT_ERROR(xpmem_make(w, PAGE, XPMEM_PERMIT_MODE, (void *)0600), EBUSY);
	EXPECT_ERROR(xemem_make(w + INTS_PER_PAGE, PAGE, "snapshot-test-busy"), EBUSY);
	EXPECT_ERROR(xemem_snapshot_release(segid + 1), ENOENT);
	EXPECT_ERROR(xemem_snapshot_release(0), ENOENT);
	EXPECT_ERROR(xemem_region_free(w + 1), EINVAL);
	CHECK(xemem_snapshot_release(segid) == 0, "release");
	/* An exported region is refused a snapshot while its segment lasts. */
	xpmem_segid_t exported = xpmem_make(w, PAGES * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(exported > 0, "xpmem_make of the region");
	EXPECT_ERROR(xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL), EBUSY);
	CHECK(xpmem_remove(exported) == 0, "remove");
	segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(segid > 0, "a snapshot once the export is gone");
	expect_filled(w, PAGES, 3, "the region through all of it");
	CHECK(xemem_region_free(w) == 0, "free with a snapshot out");
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
	EXPECT_ERROR(xemem_region_free(w), EINVAL);
	return 0;
}

/* The writer of the writer_exits case: publishes a snapshot, rewrites the region once the
 * reader attached, then exits without releasing. */
static void exiting_writer(int fd)
{
	int *w = xemem_region_alloc(PAGES * PAGE);
	CHECK(w != (void *)-1, "xemem_region_alloc");
	fill(w, PAGES, 11);
	xpmem_segid_t segid = xemem_snapshot_make(w, XPMEM_PERMIT_MODE, (void *)0600, NULL);
	CHECK(segid > 0, "xemem_snapshot_make");
	say(fd, (uint64_t)segid);
	hear(fd);
	fill(w, PAGES, 12);
}

/* The writer exits with the snapshot out: a reader keeps it, unchanged (no SIGBUS), and no new
 * reader can get it. */
static int case_writer_exits(void)
{
	int fd;
	pid_t writer = fork_reader(exiting_writer, &fd);
	xpmem_segid_t segid = (xpmem_segid_t)hear(fd);
	int *p = attach_rw(segid, 0, PAGES * PAGE, NULL);
	say(fd, 1);
	reaped(writer);
	for (int page = 0; page < PAGES; page++)
		CHECK(touch(p + page * INTS_PER_PAGE, 0) == 0, "page %d after the writer exited", page);
	expect_filled(p, PAGES, 11, "the snapshot after its writer exited");
	for (int tries = 0; xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) > 0; tries++) {
		CHECK(tries < 100, "the broker still grants the dead writer's snapshot");
		usleep(20000); /* the broker learns of the exit when the connection closes */
	}
	CHECK(errno == ENOENT, "get after the writer exited");
	return 0;
}

static const struct named_case cases[] = {
	{ "isolation", case_isolation },
	{ "readers", case_readers },
	{ "named", case_named },
	{ "errors", case_errors },
	{ "writer_exits", case_writer_exits },
	{ "sparse", case_sparse },
	{ "kept", case_kept },
};

int main(int argc, char **argv)
{
	return run_named_case(cases, sizeof cases / sizeof *cases, argc, argv);
}
