/*
 * XPMEM conformance cases for clowder's libxpmem, between host processes. Each case runs as
 * `conformance CASE` and exits 0 when it holds; `conformance --list` names them. The cases
 * mirror XPMEM's own suites (the Cray test_base/two_attach/two_shares/fork tests and the
 * openucx gtest basic and multi tests): argument errors, the permission matrix, attach
 * sharing, fork and copy-on-write in the owner, holes and SIGBUS, access patterns over up to
 * 100,000 pages, many-to-one and one-to-many, plus XEMEM's names and signals.
 *
 * Processes talk over socketpairs: an owner sends its segid (and addresses), the attacher
 * answers when done. SIGBUS/SIGSEGV are caught with sigsetjmp so a case can expect them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xpmem.h>

#include "conformance_check.h"
#include "named_cases.h"


/* ---- processes and messages ---- */

struct peer {
	pid_t pid;
	int fd;
};

static struct peer spawn(int (*body)(int fd, long arg), long arg)
{
	int pair[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0, "socketpair");
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		close(pair[0]);
		exit(body(pair[1], arg));
	}
	close(pair[1]);
	return (struct peer){ pid, pair[0] };
}

static void put(int fd, uint64_t value)
{
	CHECK(write(fd, &value, sizeof value) == sizeof value, "put");
}

static uint64_t take(int fd)
{
	uint64_t value;
	ssize_t got = read(fd, &value, sizeof value);
	CHECK(got == sizeof value, "take (peer gone?)");
	return value;
}

static void reap(struct peer p)
{
	int status;
	CHECK(waitpid(p.pid, &status, 0) == p.pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "peer %d ended with status 0x%x", p.pid, status);
	close(p.fd);
}

/* Sends the peer its last word, then waits for its answer and its exit. */
static void finish(struct peer p, uint64_t last)
{
	put(p.fd, last);
	take(p.fd);
	reap(p);
}

/* The owner's side of finish(): removes its segment, then answers. */
static int remove_and_answer(int fd, xpmem_segid_t segid)
{
	CHECK(xpmem_remove(segid) == 0, "remove");
	put(fd, 1);
	return 0;
}

/* ---- memory ---- */

static int *anonymous(size_t pages)
{
	int *p = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED, "mmap");
	return p;
}

/* `pages` fresh anonymous private pages holding int[i] = i, exported with permit `mode`: the
 * segid; the memory in *memory. */
static xpmem_segid_t export_filled(long pages, long mode, int **memory)
{
	int *p = anonymous(pages);
	fill(p, pages, 0);
	xpmem_segid_t segid = xpmem_make(p, pages * PAGE, XPMEM_PERMIT_MODE, (void *)mode);
	CHECK(segid > 0, "xpmem_make");
	*memory = p;
	return segid;
}

/* A whole-address-space segment of this process (make(0, MAXADDR)), for its owner only. */
static xpmem_segid_t make_whole(void)
{
	xpmem_segid_t segid = xpmem_make(0, XPMEM_MAXADDR_SIZE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make whole");
	return segid;
}

/* An exporter of `pages` anonymous private pages holding int[i] = i: sends segid, waits for
 * the attacher's word, then checks int[i] == i + that word. The Cray suite's xpmem_proc1. */
static int exporter(int fd, long pages)
{
	int *p;
	xpmem_segid_t segid = export_filled(pages, 0666, &p);
	put(fd, segid);
	put(fd, (uintptr_t)p);
	int added = (int)take(fd);
	expect_filled(p, pages, added, "owner after attacher wrote");
	return remove_and_answer(fd, segid);
}

/* A started exporter of `pages` pages; its segment in *segid. */
static struct peer start_exporter(long pages, xpmem_segid_t *segid)
{
	struct peer owner = spawn(exporter, pages);
	*segid = take(owner.fd);
	take(owner.fd); /* its address, which only the fork cases use */
	return owner;
}

/* ---- cases ---- */

static int case_version(void)
{
	CHECK(xpmem_version() == XPMEM_CURRENT_VERSION, "xpmem_version");
	CHECK(sizeof(struct xpmem_addr) == 16 && sizeof(xpmem_segid_t) == 8, "ABI sizes");
	return 0;
}

static int case_make_errors(void)
{
	int *p = anonymous(16);
	EXPECT_ERROR(xpmem_make((char *)p + 12, PAGE, XPMEM_PERMIT_MODE, (void *)0600), EINVAL);
	EXPECT_ERROR(xpmem_make(p, PAGE, 0, (void *)0600), EINVAL);
	EXPECT_ERROR(xpmem_make(p, PAGE, XPMEM_PERMIT_MODE, (void *)01000), EINVAL);
	EXPECT_ERROR(xpmem_make(p, 0, XPMEM_PERMIT_MODE, (void *)0600), EINVAL);
	EXPECT_ERROR(xpmem_make(p, 100, XPMEM_PERMIT_MODE, (void *)0600), EINVAL);
	EXPECT_ERROR(xpmem_make((void *)-2, PAGE, XPMEM_PERMIT_MODE, (void *)0600), EINVAL);
	EXPECT_ERROR(xpmem_make((void *)-PAGE, 2 * PAGE, XPMEM_PERMIT_MODE, (void *)0600), EINVAL);
	/* NULL base, 64 KiB, 0600: fine (the openucx gtest's first case), and so is all of it. */
	xpmem_segid_t a = xpmem_make(NULL, 16 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	xpmem_segid_t b = xpmem_make(0, XPMEM_MAXADDR_SIZE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(a > 0 && b > 0 && a != b, "make NULL/MAXADDR");
	CHECK(xpmem_remove(a) == 0 && xpmem_remove(b) == 0, "remove");
	return 0;
}

static int remove_as_other(int fd, long unused)
{
	(void)unused;
	xpmem_segid_t segid = take(fd);
	EXPECT_ERROR(xpmem_remove(segid), EACCES);
	xpmem_apid_t apid = take(fd);
	EXPECT_ERROR(xpmem_release(apid), EACCES); /* not the holder */
	struct xpmem_addr addr = { apid, 0 };
	errno = 0;
	CHECK(xpmem_attach(addr, PAGE, NULL) == (void *)-1 && errno == EACCES, "attach someone else's apid");
	return 0;
}

static int case_id_errors(void)
{
	EXPECT_ERROR(xpmem_remove(-1), EINVAL);
	CHECK(xpmem_remove(12345) == -1, "remove 12345");
	xpmem_segid_t unknown = ((xpmem_segid_t)1 << 32) | 999999;
	EXPECT_ERROR(xpmem_remove(unknown), ENOENT);
	EXPECT_ERROR(xpmem_get(-1, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EINVAL);
	CHECK(xpmem_get(12345, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) == -1, "get 12345");
	EXPECT_ERROR(xpmem_get(unknown, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
	int *p = anonymous(4);
	xpmem_segid_t segid = xpmem_make(p, 4 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make");
	EXPECT_ERROR(xpmem_get(segid, 9999, XPMEM_PERMIT_MODE, NULL), EINVAL);
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDONLY | XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EINVAL);
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, 0, NULL), EINVAL);
	/* The permit value is ignored (Open MPI passes 0666). */
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, (void *)0666);
	CHECK(apid > 0, "get with permit value");
	struct xpmem_addr addr = { apid, 0 };
	errno = 0;
	CHECK(xpmem_attach((struct xpmem_addr){ apid, 100 }, PAGE, NULL) == (void *)-1 && errno == EINVAL, "unaligned offset");
	CHECK(xpmem_attach((struct xpmem_addr){ apid, 4 * PAGE }, PAGE, NULL) == (void *)-1 && errno == EINVAL, "offset at end");
	CHECK(xpmem_attach(addr, 5 * PAGE, NULL) == (void *)-1 && errno == EINVAL, "size past end");
	CHECK(xpmem_attach(addr, 4 * PAGE + 1, NULL) == (void *)-1 && errno == EINVAL, "size rounds past end");
	CHECK(xpmem_attach(addr, 0, NULL) == (void *)-1 && errno == EINVAL, "size 0");
	CHECK(xpmem_attach(addr, PAGE, (char *)p + 1) == (void *)-1 && errno == EINVAL, "unaligned vaddr");
	CHECK(xpmem_attach((struct xpmem_addr){ -1, 0 }, PAGE, NULL) == (void *)-1 && errno == EINVAL, "apid -1");
	xpmem_apid_t unknown_apid = ((xpmem_apid_t)1 << 32) | 0x80000000 | 999999;
	CHECK(xpmem_attach((struct xpmem_addr){ unknown_apid, 0 }, PAGE, NULL) == (void *)-1 && errno == ENOENT, "unknown apid");
	/* A read-only permit cannot attach: EACCES, as XPMEM. */
	xpmem_apid_t ro = xpmem_get(segid, XPMEM_RDONLY, XPMEM_PERMIT_MODE, NULL);
	CHECK(ro > 0, "get RDONLY");
	CHECK(xpmem_attach((struct xpmem_addr){ ro, 0 }, PAGE, NULL) == (void *)-1 && errno == EACCES, "RDONLY attach");
	/* Another process may neither remove our segment nor use our permit. */
	struct peer other = spawn(remove_as_other, 0);
	put(other.fd, segid);
	put(other.fd, apid);
	reap(other);
	/* get, release, remove; then everything on them is ENOENT. */
	CHECK(xpmem_release(apid) == 0 && xpmem_release(ro) == 0, "release");
	EXPECT_ERROR(xpmem_release(apid), ENOENT);
	CHECK(xpmem_remove(segid) == 0, "remove");
	EXPECT_ERROR(xpmem_remove(segid), ENOENT);
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
	/* detach: of nothing mapped is 0, of a mapping that is not an attachment EINVAL. */
	void *unmapped = anonymous(1);
	munmap(unmapped, PAGE);
	CHECK(xpmem_detach(unmapped) == 0, "detach unmapped");
	EXPECT_ERROR(xpmem_detach(p), EINVAL);
	return 0;
}

/* Permission matrix: a process with `uid` makes a segment with `mode` and a process with
 * `requester_uid` asks for RDONLY and RDWR. Expected as SysV IPC (and the openucx gtest). */
struct matrix_row {
	unsigned mode;
	int ro_ok, rw_ok;
};

static int matrix_requester(int fd, long uid)
{
	CHECK(setgid(uid) == 0 && setuid(uid) == 0, "setuid %ld", uid);
	xpmem_segid_t segid = take(fd);
	int mask = 0;
	for (int flags = XPMEM_RDONLY; flags <= XPMEM_RDWR; flags++) {
		errno = 0;
		xpmem_apid_t apid = xpmem_get(segid, flags, XPMEM_PERMIT_MODE, NULL);
		if (apid > 0) {
			mask |= flags;
			xpmem_release(apid);
		} else {
			CHECK(errno == EACCES, "refusal must be EACCES");
		}
	}
	put(fd, mask);
	return 0;
}

static int matrix_owner(int fd, long uid)
{
	if (uid)
		CHECK(setgid(uid) == 0 && setuid(uid) == 0, "setuid %ld", uid);
	int *p = anonymous(1);
	for (;;) {
		unsigned mode = take(fd);
		if (mode == 0xffff)
			return 0;
		xpmem_segid_t segid = xpmem_make(p, PAGE, XPMEM_PERMIT_MODE, (void *)(uintptr_t)mode);
		CHECK(segid > 0, "make mode %o", mode);
		put(fd, segid);
		take(fd);
		CHECK(xpmem_remove(segid) == 0, "remove");
	}
}

static void run_matrix(long owner_uid, long requester_uid, const struct matrix_row *rows, int n)
{
	struct peer owner = spawn(matrix_owner, owner_uid);
	for (int i = 0; i < n; i++) {
		put(owner.fd, rows[i].mode);
		xpmem_segid_t segid = take(owner.fd);
		struct peer requester = spawn(matrix_requester, requester_uid);
		put(requester.fd, segid);
		int mask = take(requester.fd);
		reap(requester);
		int want = (rows[i].ro_ok ? XPMEM_RDONLY : 0) | (rows[i].rw_ok ? XPMEM_RDWR : 0);
		CHECK(mask == want, "owner uid %ld mode %o requester uid %ld: allowed 0x%x, want 0x%x", owner_uid,
		      rows[i].mode, requester_uid, mask, want);
		put(owner.fd, 1);
	}
	put(owner.fd, 0xffff);
	reap(owner);
}

static int case_permissions(void)
{
	const struct matrix_row same_user[] = {
		{ 0600, 1, 1 }, { 0400, 1, 0 }, { 0200, 0, 0 }, { 0000, 0, 0 },
	};
	const struct matrix_row root[] = {
		{ 0600, 1, 1 }, { 0400, 1, 1 }, { 0200, 1, 1 }, { 0000, 1, 1 },
	};
	const struct matrix_row stranger[] = {
		{ 0600, 0, 0 }, { 0606, 1, 1 }, { 0604, 1, 0 }, { 0660, 0, 0 },
	};
	if (getuid() != 0) {
		fprintf(stderr, "permissions: needs root (setuid in children)\n");
		return 1;
	}
	run_matrix(65534, 65534, same_user, 4); /* unprivileged owner and requester */
	run_matrix(65534, 0, root, 4);          /* root passes every mode (CAP_IPC_OWNER) */
	run_matrix(0, 0, root, 4);
	run_matrix(65534, 65533, stranger, 4); /* neither owner nor group: the "other" bits */
	return 0;
}

/* An exporter of 4 pages whose segment `attach` attaches and adds to: the exporter must see
 * i + `added`. */
static int exported_and_added(int *(*attach)(xpmem_segid_t), int added)
{
	xpmem_segid_t segid;
	struct peer owner = start_exporter(4, &segid);
	attach(segid);
	finish(owner, added);
	return 0;
}

/* test_base: attach 4 pages at offset 0, check i, add 1; the exporter sees i + 1. */
static int case_base(void)
{
	return exported_and_added(attach_and_add_one, 1);
}

/* test_two_attach: two permits, two attachments, each adds 1. */
static int case_two_attach(void)
{
	return exported_and_added(attach_twice_and_add_one, 2);
}

/* test_two_shares: two segments from two exporters, both incremented. */
static int case_two_shares(void)
{
	xpmem_segid_t s1, s2;
	struct peer one = start_exporter(4, &s1), two = start_exporter(4, &s2);
	CHECK(s1 != s2, "distinct segids");
	int *a = attach_rw(s1, 0, 4 * PAGE, NULL), *b = attach_rw(s2, 0, 4 * PAGE, NULL);
	for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++) {
		a[i] += 1;
		b[i] += 1;
	}
	finish(one, 1);
	finish(two, 1);
	return 0;
}

/* test_fork: the attacher maps page 1 and reads it; the exporter forks and writes +1
 * everywhere; the attacher adds 1; page 1 then holds i + 2 in the exporter. The child's own
 * copy stays private: its writes reach neither the parent nor the attacher. */
static int fork_exporter(int fd, long unused)
{
	(void)unused;
	int *p;
	xpmem_segid_t segid = export_filled(4, 0666, &p);
	put(fd, segid);
	take(fd); /* the attacher has read page 1 */
	int child_pipe[2];
	CHECK(pipe(child_pipe) == 0, "pipe");
	pid_t child = fork();
	if (child == 0) {
		/* The child's view is the parent's memory as of fork, and private from now on. */
		expect_filled(p, 4, 0, "child right after fork");
		for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++)
			p[i] = -7;
		char c;
		CHECK(read(child_pipe[0], &c, 1) == 1, "child wait");
		for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++)
			CHECK(p[i] == -7, "child sees the parent's later writes");
		_exit(0);
	}
	for (size_t i = 0; i < 4 * INTS_PER_PAGE; i++)
		p[i] += 1;
	put(fd, 1); /* the attacher may add now */
	take(fd);
	for (size_t i = 0; i < INTS_PER_PAGE; i++)
		CHECK(p[INTS_PER_PAGE + i] == (int)(INTS_PER_PAGE + i) + 2, "page 1 int %zu is %d", i, p[INTS_PER_PAGE + i]);
	CHECK(write(child_pipe[1], "x", 1) == 1, "wake child");
	int status;
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child");
	put(fd, 1);
	return 0;
}

static int case_fork_cow(void)
{
	struct peer owner = spawn(fork_exporter, 0);
	xpmem_segid_t segid = take(owner.fd);
	int *p = attach_rw(segid, PAGE, PAGE, NULL);
	expect_filled(p, 1, INTS_PER_PAGE, "page 1 before fork");
	put(owner.fd, 1);
	take(owner.fd);
	for (size_t i = 0; i < INTS_PER_PAGE; i++)
		CHECK(p[i] == (int)(INTS_PER_PAGE + i) + 1, "attacher sees the parent's post-fork write");
	for (size_t i = 0; i < INTS_PER_PAGE; i++)
		p[i] += 1;
	finish(owner, 1);
	return 0;
}

/* Attachments are not inherited: a forked child of the attacher has no mapping there. */
static int case_fork_attacher(void)
{
	xpmem_segid_t segid;
	struct peer owner = start_exporter(4, &segid);
	int *p = attach_rw(segid, 0, 4 * PAGE, NULL);
	pid_t child = fork();
	if (child == 0) {
		(void)*(volatile int *)p;
		_exit(0);
	}
	int status;
	CHECK(waitpid(child, &status, 0) == child, "wait");
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "child touching the attachment: status 0x%x", status);
	expect_filled(p, 4, 0, "parent keeps its attachment");
	finish(owner, 0);
	return 0;
}

/* make(0, MAXADDR): memory allocated after make is attachable at offset = its address. */
static int whole_space_owner(int fd, long pages)
{
	xpmem_segid_t segid = make_whole();
	int *heap = malloc(pages * PAGE + PAGE);
	int *aligned = (int *)(((uintptr_t)heap + PAGE - 1) & ~(PAGE - 1));
	fill(aligned, pages, 1000);
	put(fd, segid);
	put(fd, (uintptr_t)aligned);
	take(fd);
	expect_filled(aligned, pages, 1001, "owner's heap after the attacher's +1");
	free(heap);
	return remove_and_answer(fd, segid);
}

static int case_whole_address_space(void)
{
	struct peer owner = spawn(whole_space_owner, 64);
	xpmem_segid_t segid = take(owner.fd);
	uintptr_t where = take(owner.fd);
	int *p = attach_rw(segid, (off_t)where, 64 * PAGE, NULL);
	expect_filled(p, 64, 1000, "attacher at the owner's address");
	for (size_t i = 0; i < 64 * INTS_PER_PAGE; i++)
		p[i] += 1;
	finish(owner, 1);
	return 0;
}

/* The openucx gtest's self attach of a whole-address-space segment. */
static int case_self_attach(void)
{
	xpmem_segid_t segid = make_whole();
	int *mine = anonymous(64);
	fill(mine, 64, 5);
	xpmem_apid_t apid;
	int *view = attach_rw(segid, (off_t)(uintptr_t)mine, 64 * PAGE, &apid);
	CHECK(view != mine, "a second mapping");
	expect_filled(view, 64, 5, "self attachment");
	view[3] = -1;
	CHECK(mine[3] == -1, "write through the attachment reaches the source");
	mine[4] = -2;
	CHECK(view[4] == -2, "write to the source shows in the attachment");
	errno = 0;
	CHECK(xpmem_attach((struct xpmem_addr){ apid, (off_t)(uintptr_t)mine }, PAGE, mine) == (void *)-1 && errno == EINVAL,
	      "a fixed self attach over its own source");
	CHECK(mine[0] == 5, "the source survived the refused attach");
	CHECK(xpmem_detach(view) == 0 && xpmem_release(apid) == 0 && xpmem_remove(segid) == 0, "teardown");
	CHECK(mine[3] == -1 && mine[5] == 10, "source intact after remove");
	return 0;
}

/* A segment reaching 3 pages before and 2 after a 10-page mapping, with pages 4..5 unmapped:
 * valid pages work, holes raise SIGBUS. */
static int holes_owner(int fd, long unused)
{
	(void)unused;
	char *area = mmap(NULL, 15 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(area != MAP_FAILED, "reserve");
	munmap(area, 15 * PAGE);
	int *p = mmap(area + 3 * PAGE, 10 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	CHECK(p != MAP_FAILED, "mmap");
	fill(p, 10, 0);
	munmap((char *)p + 4 * PAGE, 2 * PAGE);
	xpmem_segid_t segid = xpmem_make(area, 15 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make over holes");
	/* A page unmapped after make (page 9 of the mapping, page 12 of the segment): a hole too. */
	munmap((char *)p + 9 * PAGE, PAGE);
	put(fd, segid);
	take(fd);
	return remove_and_answer(fd, segid);
}

static int case_holes_sigbus(void)
{
	struct peer owner = spawn(holes_owner, 0);
	xpmem_segid_t segid = take(owner.fd);
	expect_holes(segid);
	finish(owner, 1);
	return 0;
}

/* After remove, existing attachments raise SIGBUS; the owner keeps its data. */
static int remove_owner(int fd, long pages)
{
	int *p;
	xpmem_segid_t segid = export_filled(pages, 0600, &p);
	put(fd, segid);
	take(fd); /* attached and checked */
	CHECK(xpmem_remove(segid) == 0, "remove");
	expect_filled(p, pages, 0, "owner data after remove");
	p[0] = 77; /* and it is still ours to write */
	CHECK(p[0] == 77, "owner write after remove");
	put(fd, 1);
	take(fd);
	return 0;
}

static int case_remove_sigbus(void)
{
	struct peer owner = spawn(remove_owner, 8);
	xpmem_segid_t segid = take(owner.fd);
	int *p = attach_rw(segid, 0, 8 * PAGE, NULL);
	expect_filled(p, 8, 0, "before remove");
	put(owner.fd, 1);
	take(owner.fd);
	CHECK(touch(p, 0) == SIGBUS, "read after remove");
	CHECK(touch(p + 7 * INTS_PER_PAGE, 1) == SIGBUS, "write after remove");
	CHECK(xpmem_detach(p) == 0, "detach still works");
	put(owner.fd, 1);
	reap(owner);
	return 0;
}

static int exiting_owner(int fd, long pages)
{
	int *p;
	xpmem_segid_t segid = export_filled(pages, 0600, &p);
	put(fd, segid);
	take(fd);
	_exit(0); /* no remove: the broker revokes when the process is gone */
}

static int case_owner_exit_sigbus(void)
{
	struct peer owner = spawn(exiting_owner, 8);
	xpmem_segid_t segid = take(owner.fd);
	xpmem_apid_t apid;
	int *p = attach_rw(segid, 0, 8 * PAGE, &apid);
	expect_filled(p, 8, 0, "before exit");
	put(owner.fd, 1);
	reap(owner);
	/* The broker learns of the exit when the connection closes: allow it a moment. */
	int sig = 0;
	for (int i = 0; i < 200 && sig != SIGBUS; i++) {
		sig = touch(p, 0);
		if (sig != SIGBUS)
			usleep(10000);
	}
	CHECK(sig == SIGBUS, "touch after the owner exited");
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT);
	return 0;
}

/* Access patterns over many pages: sequential, reverse, random, sparse (every 200th page);
 * with the owner filling, and with the owner never touching (attacher writes, owner reads). */
static int patterns_owner(int fd, long pages)
{
	int filled = pages > 0;
	if (pages < 0)
		pages = -pages;
	int *p = anonymous(pages);
	if (filled)
		for (long i = 0; i < pages; i++)
			p[i * INTS_PER_PAGE] = (int)i;
	xpmem_segid_t segid = xpmem_make(p, pages * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make");
	put(fd, segid);
	take(fd);
	for (long i = 0; i < pages; i++)
		CHECK(p[i * INTS_PER_PAGE + 1] == (int)(i * 3), "owner reads page %ld", i);
	return remove_and_answer(fd, segid);
}

static void patterns(long pages, int filled)
{
	struct peer owner = spawn(patterns_owner, filled ? pages : -pages);
	xpmem_segid_t segid = take(owner.fd);
	int *p = attach_rw(segid, 0, pages * PAGE, NULL);
	long want = 0;
	/* sequential reads */
	for (long i = 0; i < pages; i++)
		CHECK(p[i * INTS_PER_PAGE] == (filled ? i : 0), "sequential page %ld", i);
	/* reverse writes */
	for (long i = pages - 1; i >= 0; i--)
		p[i * INTS_PER_PAGE + 1] = (int)(i * 3);
	/* random reads (a full-period LCG visits every page once) */
	uint64_t x = 12345;
	for (long n = 0; n < pages; n++) {
		x = (x * 6364136223846793005ULL + 1442695040888963407ULL);
		long i = (long)((x >> 33) % pages);
		CHECK(p[i * INTS_PER_PAGE + 1] == (int)(i * 3), "random page %ld", i);
		want++;
	}
	/* sparse: every 200th page */
	for (long i = 0; i < pages; i += 200)
		CHECK(p[i * INTS_PER_PAGE] == (filled ? i : 0), "sparse page %ld", i);
	(void)want;
	finish(owner, 1);
}

static int case_patterns(void)
{
	static const long sizes[] = { 1, 100, 10000, 100000 };
	for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		patterns(sizes[i], 1);
		patterns(sizes[i], 0);
	}
	return 0;
}

/* Many attachers to one owner: each peer writes its own slice. */
static int slice_writer(int fd, long index)
{
	xpmem_segid_t segid = take(fd);
	long pages_each = take(fd);
	int *p = attach_rw(segid, index * pages_each * PAGE, pages_each * PAGE, NULL);
	for (long i = 0; i < pages_each * (long)INTS_PER_PAGE; i++)
		p[i] = (int)(index * 1000000 + i);
	put(fd, 1);
	return 0;
}

static int case_many_to_one(void)
{
	static const int peer_counts[] = { 1, 3, 5, 10 };
	for (unsigned c = 0; c < 4; c++) {
		int peers = peer_counts[c];
		long pages_each = 64;
		int *p = anonymous(peers * pages_each);
		xpmem_segid_t segid = xpmem_make(p, peers * pages_each * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
		CHECK(segid > 0, "make");
		struct peer list[10];
		for (int i = 0; i < peers; i++) {
			list[i] = spawn(slice_writer, i);
			put(list[i].fd, segid);
			put(list[i].fd, pages_each);
		}
		for (int i = 0; i < peers; i++) {
			take(list[i].fd);
			reap(list[i]);
		}
		for (int i = 0; i < peers; i++)
			for (long k = 0; k < pages_each * (long)INTS_PER_PAGE; k++)
				CHECK(p[i * pages_each * INTS_PER_PAGE + k] == (int)(i * 1000000 + k), "peer %d slice", i);
		CHECK(xpmem_remove(segid) == 0, "remove");
		munmap(p, peers * pages_each * PAGE);
	}
	return 0;
}

/* One attacher to many owners; also several segids over the same region of one owner. */
static int case_one_to_many(void)
{
	struct peer owners[5];
	xpmem_segid_t segids[5];
	for (int i = 0; i < 5; i++) {
		owners[i] = start_exporter(16, &segids[i]);
	}
	int *views[5];
	for (int i = 0; i < 5; i++)
		views[i] = attach_rw(segids[i], 0, 16 * PAGE, NULL);
	for (int i = 0; i < 5; i++) {
		expect_filled(views[i], 16, 0, "owner view");
		for (size_t k = 0; k < 16 * INTS_PER_PAGE; k++)
			views[i][k] += i + 1;
	}
	for (int i = 0; i < 5; i++) {
		finish(owners[i], i + 1);
	}
	/* Several segids over the same region. */
	int *p = anonymous(8);
	fill(p, 8, 0);
	xpmem_segid_t a = xpmem_make(p, 8 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	xpmem_segid_t b = xpmem_make(p + 2 * INTS_PER_PAGE, 4 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(a > 0 && b > 0 && a != b, "overlapping makes");
	int *va = attach_rw(a, 2 * PAGE, PAGE, NULL), *vb = attach_rw(b, 0, PAGE, NULL);
	CHECK(va[0] == vb[0] && va[0] == (int)(2 * INTS_PER_PAGE), "same page through two segments");
	return 0;
}

/* memfd-backed memory is shared as it is (no conversion); GASNet-style fixed-address attach. */
static int case_memfd_and_fixed(void)
{
	int fd = memfd_create("app", MFD_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, 4 * PAGE) == 0, "memfd");
	int *p = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED, "mmap memfd");
	fill(p, 4, 9);
	xpmem_segid_t segid = xpmem_make(p, 4 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make");
	int *other = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(other != MAP_FAILED, "mmap memfd");
	other[0] = -9;
	CHECK(p[0] == -9, "the application's memfd still backs the segment");
	char *spot = mmap(NULL, 4 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	int *view = xpmem_attach((struct xpmem_addr){ apid, 0 }, 4 * PAGE, spot);
	CHECK(view == (int *)spot, "fixed-address attach");
	CHECK(view[0] == -9 && view[5] == 14, "content through the fixed attachment");
	errno = 0;
	CHECK(xpmem_attach((struct xpmem_addr){ apid, 0 }, PAGE, spot) == (void *)-1 && errno == EINVAL,
	      "fixed attach over an attachment");
	CHECK(xpmem_detach(view) == 0 && xpmem_remove(segid) == 0, "teardown");
	return 0;
}

/* A thread keeps incrementing a counter in every page while make converts the region: an
 * increment that landed on the old private page after it was copied would be lost for good,
 * so every counter must equal the number of sweeps. */
#define SWEEP_PAGES 2048
static volatile int stop_writer, writer_swept;
static void *writer(void *arg)
{
	volatile int *p = arg;
	while (!stop_writer) {
		for (size_t i = 0; i < SWEEP_PAGES; i++)
			p[i * INTS_PER_PAGE] += 1;
		writer_swept = writer_swept + 1;
	}
	return NULL;
}

static int case_concurrent_conversion(void)
{
	for (int round = 0; round < 20; round++) {
		int *p = anonymous(SWEEP_PAGES);
		fill(p, SWEEP_PAGES, 0);
		for (size_t i = 0; i < SWEEP_PAGES; i++)
			p[i * INTS_PER_PAGE] = 0;
		stop_writer = writer_swept = 0;
		pthread_t thread;
		CHECK(pthread_create(&thread, NULL, writer, p) == 0, "thread");
		while (writer_swept < 2)
			sched_yield();
		int before = writer_swept;
		xpmem_segid_t segid = xpmem_make(p, SWEEP_PAGES * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
		CHECK(segid > 0, "make");
		int during = writer_swept;
		while (writer_swept < during + 2)
			sched_yield();
		stop_writer = 1;
		pthread_join(thread, NULL);
		CHECK(writer_swept > before, "the writer ran across the conversion");
		for (size_t i = 0; i < SWEEP_PAGES; i++)
			CHECK(p[i * INTS_PER_PAGE] == writer_swept, "round %d page %zu lost increments (%d of %d)", round, i,
			      p[i * INTS_PER_PAGE], writer_swept);
		for (size_t i = 0; i < SWEEP_PAGES; i++)
			CHECK(p[i * INTS_PER_PAGE + 1] == (int)(i * INTS_PER_PAGE + 1), "content");
		xpmem_apid_t apid;
		int *view = attach_rw(segid, 0, SWEEP_PAGES * PAGE, &apid);
		CHECK(view[INTS_PER_PAGE] == p[INTS_PER_PAGE], "shared after conversion");
		CHECK(xpmem_detach(view) == 0 && xpmem_release(apid) == 0 && xpmem_remove(segid) == 0, "teardown");
		munmap(p, SWEEP_PAGES * PAGE);
	}
	return 0;
}

/* XEMEM: named segments and signals. */
static int named_owner(int fd, long unused)
{
	(void)unused;
	int *p = anonymous(2);
	fill(p, 2, 50);
	xpmem_segid_t segid = xemem_make(p, 2 * PAGE, "cg-solution");
	CHECK(segid > 0, "xemem_make");
	EXPECT_ERROR(xemem_make(p, 2 * PAGE, "cg-solution"), EEXIST);
	EXPECT_ERROR(xemem_make(p, 2 * PAGE, "has space"), EINVAL);
	int nfd = xemem_notify_fd(segid);
	CHECK(nfd >= 0, "notify fd");
	put(fd, 1);
	struct pollfd pfd = { .fd = nfd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1, "signal arrives");
	uint64_t count;
	CHECK(read(nfd, &count, sizeof count) == sizeof count && count >= 1, "signal count");
	CHECK(p[0] == -50, "the attacher wrote before signalling");
	CHECK(xpmem_remove(segid) == 0, "remove");
	put(fd, 1);
	take(fd);
	return 0;
}

static int case_names_and_signals(void)
{
	EXPECT_ERROR(xemem_lookup_segid("cg-solution"), ENOENT);
	struct peer owner = spawn(named_owner, 0);
	take(owner.fd);
	xpmem_segid_t segid = xemem_lookup_segid("cg-solution");
	CHECK(segid > 0, "lookup");
	xpmem_apid_t apid;
	int *p = attach_rw(segid, 0, 2 * PAGE, &apid);
	expect_filled(p, 2, 50, "named segment");
	p[0] = -50;
	CHECK(xemem_signal(apid) == 0, "signal");
	take(owner.fd);
	EXPECT_ERROR(xemem_lookup_segid("cg-solution"), ENOENT);
	put(owner.fd, 1);
	reap(owner);
	return 0;
}

/* The owner unmaps exported memory: once the library next runs (here: another make), the
 * attachers of the unmapped part see SIGBUS and its memory is freed; a range mremap'd
 * elsewhere (as realloc does) stays exported at its new address and survives fork. */
static int munmap_owner(int fd, long unused)
{
	(void)unused;
	xpmem_segid_t whole = make_whole();
	int *gone = anonymous(8), *moving = anonymous(8);
	fill(gone, 8, 0);
	fill(moving, 8, 100);
	put(fd, whole);
	put(fd, (uintptr_t)gone);
	put(fd, (uintptr_t)moving);
	take(fd); /* attached both */
	munmap(gone, 8 * PAGE);
	char *spot = mmap(NULL, 64 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int *moved = mremap(moving, 8 * PAGE, 8 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, spot + 16 * PAGE);
	CHECK(moved != MAP_FAILED, "mremap");
	int *other = anonymous(1);
	xpmem_segid_t poke = xpmem_make(other, PAGE, XPMEM_PERMIT_MODE, (void *)0600); /* runs the pruning */
	CHECK(poke > 0, "make");
	pid_t child = fork();
	if (child == 0) {
		moved[0] = -1; /* private to the child */
		_exit(moved[1] == 101 ? 0 : 1);
	}
	int status;
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child");
	CHECK(moved[0] == 100, "the child's write stayed in the child");
	put(fd, (uintptr_t)moved);
	take(fd);
	expect_filled(moved, 8, 101, "moved region after the attacher's +1 at its new address");
	put(fd, 1);
	return 0;
}

static int case_owner_munmap(void)
{
	struct peer owner = spawn(munmap_owner, 0);
	xpmem_segid_t segid = take(owner.fd);
	uintptr_t gone_at = take(owner.fd), moving_at = take(owner.fd);
	int *gone = attach_rw(segid, (off_t)gone_at, 8 * PAGE, NULL);
	int *moving = attach_rw(segid, (off_t)moving_at, 8 * PAGE, NULL);
	expect_filled(gone, 8, 0, "before munmap");
	put(owner.fd, 1);
	uintptr_t moved_at = take(owner.fd);
	CHECK(touch(gone, 0) == SIGBUS, "attachment of unmapped memory");
	/* The old attachment of the moved range still shows the same pages. */
	expect_filled(moving, 8, 100, "attachment of the moved range");
	int *moved = attach_rw(segid, (off_t)moved_at, 8 * PAGE, NULL);
	for (size_t i = 0; i < 8 * INTS_PER_PAGE; i++)
		moved[i] += 1;
	CHECK(moving[5] == 106, "both attachments see one memory");
	finish(owner, 1);
	return 0;
}

/* The owner of a whole-address-space segment with 4 MiB at `at` (base 0), remapped on the
 * attacher's word to new memory (base 500) at the same address, then removed on its next. */
static int remapping_owner(int fd, long pages)
{
	xpmem_segid_t whole = make_whole();
	int *at = anonymous(pages);
	fill(at, pages, 0);
	put(fd, whole);
	put(fd, (uintptr_t)at);
	take(fd);
	int *again = mmap(at, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	CHECK(again == at, "remap");
	fill(again, pages, 500);
	put(fd, 1);
	take(fd);
	CHECK(xpmem_remove(whole) == 0, "remove");
	put(fd, 1);
	take(fd);
	return 0;
}

/* An attachment of 2 MiB or more is parked at detach and handed out again to an attach of the
 * same range while the owner answers with the same memory (see park_attachment in
 * src/parking.c): the detached address faults (SIGSEGV, as XPMEM), the second attach sees the
 * same memory (a write through the first shows), an attach after the owner remapped the range
 * sees the new memory, and one after the owner's remove fails. */
static int case_reattach_parked(void)
{
	const long pages = 1024;
	struct peer owner = spawn(remapping_owner, pages);
	xpmem_segid_t segid = take(owner.fd);
	off_t at = (off_t)take(owner.fd);
	xpmem_apid_t apid;
	int *first = attach_rw(segid, at, pages * PAGE, &apid);
	expect_filled(first, pages, 0, "first attach");
	first[3] = -3;
	CHECK(xpmem_detach(first) == 0, "detach");
	CHECK(touch(first, 0) == SIGSEGV, "the detached address faults with SIGSEGV");
	struct xpmem_addr addr = { .apid = apid, .offset = at };
	int *second = xpmem_attach(addr, pages * PAGE, NULL);
	CHECK(second != (void *)-1, "second attach");
	CHECK(second[3] == -3 && second[4] == 4 && second[pages * INTS_PER_PAGE - 1] == (int)(pages * INTS_PER_PAGE - 1),
	      "the second attach maps the same memory");
	second[3] = 3;
	CHECK(xpmem_detach(second) == 0, "detach again");
	/* A fixed address: the kept mapping moves there. */
	char *spot = mmap(NULL, pages * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int *fixed = xpmem_attach(addr, pages * PAGE, spot);
	CHECK(fixed == (int *)spot, "attach at a fixed address");
	expect_filled(fixed, pages, 0, "attach at a fixed address");
	CHECK(xpmem_detach(fixed) == 0, "detach the fixed one");
	CHECK(touch((int *)spot, 0) == SIGSEGV, "the fixed address faults after detach");
	put(owner.fd, 1);
	take(owner.fd); /* remapped */
	int *third = xpmem_attach(addr, pages * PAGE, NULL);
	CHECK(third != (void *)-1, "attach after the owner remapped");
	expect_filled(third, pages, 500, "attach after the owner remapped");
	CHECK(xpmem_detach(third) == 0, "detach the third");
	put(owner.fd, 1);
	take(owner.fd); /* removed */
	CHECK(xpmem_attach(addr, pages * PAGE, NULL) == (void *)-1, "attach after remove fails");
	xpmem_release(apid);
	put(owner.fd, 1);
	reap(owner);
	return 0;
}

/* A self attachment of a whole-address-space segment raises SIGBUS after remove, and the
 * source keeps its data (the attachment is not mistaken for the owner's memory). */
static int case_self_attach_remove(void)
{
	xpmem_segid_t segid = make_whole();
	int *mine = anonymous(16);
	fill(mine, 16, 3);
	int *view = attach_rw(segid, (off_t)(uintptr_t)mine, 16 * PAGE, NULL);
	expect_filled(view, 16, 3, "self attachment");
	CHECK(xpmem_remove(segid) == 0, "remove");
	CHECK(touch(view, 0) == SIGBUS, "self attachment after remove");
	expect_filled(mine, 16, 3, "source after remove");
	mine[0] = 9;
	CHECK(mine[0] == 9, "source writable after remove");
	return 0;
}

/* Without /dev/xpmem, forcing the device backend fails cleanly (the LWK and hosts with the
 * XPMEM module get the ioctl backend; everything else uses the broker). */
static int case_device_backend(void)
{
	if (access("/dev/xpmem", F_OK) == 0)
		return 0; /* a real device: the other cases already ran against it */
	setenv("CLOWDER_XEMEM_BACKEND", "device", 1);
	EXPECT_ERROR(xpmem_version(), ENOENT);
	int *p = anonymous(1);
	EXPECT_ERROR(xpmem_make(p, PAGE, XPMEM_PERMIT_MODE, (void *)0600), ENOENT);
	EXPECT_ERROR(xemem_lookup_segid("anything"), ENOENT);
	return 0;
}

/* A misspelt CLOWDER_XEMEM_BACKEND picks no backend behind the user's back: the library says
 * so once on stderr and every call fails with EINVAL. */
static int case_misnamed_backend(void)
{
	setenv("CLOWDER_XEMEM_BACKEND", "brokr", 1);
	FILE *said = tmpfile();
	CHECK(said != NULL, "tmpfile");
	int saved_stderr = dup(2);
	dup2(fileno(said), 2);
	EXPECT_ERROR(xpmem_version(), EINVAL);
	int *p = anonymous(1);
	EXPECT_ERROR(xpmem_make(p, PAGE, XPMEM_PERMIT_MODE, (void *)0600), EINVAL);
	EXPECT_ERROR(xpmem_get(1, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EINVAL);
	struct xpmem_addr addr = { .apid = 1, .offset = 0 };
	CHECK(xpmem_attach(addr, PAGE, NULL) == (void *)-1 && errno == EINVAL, "attach with a misnamed backend");
	EXPECT_ERROR(xemem_lookup_segid("anything"), EINVAL);
	dup2(saved_stderr, 2);
	char text[256] = "";
	rewind(said);
	size_t n = fread(text, 1, sizeof text - 1, said);
	text[n] = 0;
	const char *said_first = strstr(text, "CLOWDER_XEMEM_BACKEND must be 'broker', 'device' or 'pci', not 'brokr'");
	CHECK(said_first != NULL, "the library names the setting: '%s'", text);
	CHECK(strstr(said_first + 1, "CLOWDER_XEMEM_BACKEND") == NULL, "said once: '%s'", text);
	return 0;
}

/* fork while another thread allocates from a converted malloc heap: fork must not deadlock
 * (a thread parked on frozen memory while holding the malloc lock glibc's fork needs), and
 * each child gets a usable heap of its own. */
static volatile int stop_allocator;
static void *allocator(void *arg)
{
	(void)arg;
	while (!stop_allocator) {
		char *p = malloc(64 + (rand() & 1023));
		if (p) {
			p[0] = 1;
			free(p);
		}
	}
	return NULL;
}

static int case_fork_with_threads(void)
{
	/* Every thread allocates from the main (brk) heap, which never shrinks, and the heap is
	 * exported whole: the allocator's malloc metadata lives in converted memory. */
	mallopt(M_ARENA_MAX, 1);
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
	char *chunk = malloc(4 << 20);
	memset(chunk, 7, 4 << 20);
	uintptr_t lo = 0, hi = 0;
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[256];
	while (maps && fgets(line, sizeof line, maps))
		if (strstr(line, "[heap]"))
			sscanf(line, "%lx-%lx", &lo, &hi);
	if (maps)
		fclose(maps);
	CHECK(lo && (uintptr_t)chunk >= lo && (uintptr_t)chunk < hi, "the chunk is on the brk heap");
	xpmem_segid_t segid = xpmem_make((void *)lo, hi - lo, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make over the heap");
	pthread_t thread;
	stop_allocator = 0;
	CHECK(pthread_create(&thread, NULL, allocator, NULL) == 0, "thread");
	for (int i = 0; i < 100; i++) {
		pid_t child = fork();
		CHECK(child >= 0, "fork");
		if (child == 0) {
			char *mine = malloc(4096);
			mine[0] = 2;
			chunk[5] = 9; /* the child's heap is private */
			_exit(mine[0] == 2 && chunk[6] == 7 ? 0 : 1);
		}
		int status;
		CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d", i);
		CHECK(chunk[5] == 7, "a child's write reached the parent");
	}
	stop_allocator = 1;
	pthread_join(thread, NULL);
	CHECK(xpmem_remove(segid) == 0, "remove");
	return 0;
}

/* The library's own data (its tables and freeze state, written while memory is frozen) is
 * never converted: attaching it through a whole-address-space segment gives holes, and the
 * library keeps working. */
static int case_library_data(void)
{
	/* The file the library was loaded from (in a static program, the program itself). */
	Dl_info info;
	char library[PATH_MAX];
	const char *where = dladdr((void *)xpmem_make, &info) && info.dli_fname && strchr(info.dli_fname, '/')
				    ? info.dli_fname
				    : "/proc/self/exe";
	CHECK(realpath(where, library) != NULL, "realpath %s", where);
	uintptr_t lo = 0, hi = 0;
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[512];
	while (maps && fgets(line, sizeof line, maps)) {
		uintptr_t a, b;
		char perms[5], path[400] = "";
		if (sscanf(line, "%lx-%lx %4s %*x %*x:%*x %*u %399s", &a, &b, perms, path) >= 3 && !strcmp(perms, "rw-p") &&
		    !strcmp(path, library) && !lo) {
			lo = a;
			hi = b;
		}
	}
	if (maps)
		fclose(maps);
	CHECK(lo != 0, "the library's data mapping (%s)", library);
	xpmem_segid_t whole = make_whole();
	xpmem_apid_t apid;
	int *view = attach_rw(whole, (off_t)lo, hi - lo, &apid);
	CHECK(touch(view, 0) == SIGBUS, "the library's data is a hole");
	int *p = anonymous(4);
	fill(p, 4, 1);
	xpmem_segid_t other = xpmem_make(p, 4 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(other > 0 && xpmem_remove(other) == 0, "the library still works");
	CHECK(xpmem_detach(view) == 0 && xpmem_release(apid) == 0 && xpmem_remove(whole) == 0, "teardown");
	return 0;
}

static const struct named_case cases[] = {
	{ "version", case_version },
	{ "make_errors", case_make_errors },
	{ "id_errors", case_id_errors },
	{ "permissions", case_permissions },
	{ "base", case_base },
	{ "two_attach", case_two_attach },
	{ "two_shares", case_two_shares },
	{ "fork_cow", case_fork_cow },
	{ "fork_attacher", case_fork_attacher },
	{ "whole_address_space", case_whole_address_space },
	{ "self_attach", case_self_attach },
	{ "holes_sigbus", case_holes_sigbus },
	{ "remove_sigbus", case_remove_sigbus },
	{ "owner_exit_sigbus", case_owner_exit_sigbus },
	{ "patterns", case_patterns },
	{ "many_to_one", case_many_to_one },
	{ "one_to_many", case_one_to_many },
	{ "memfd_and_fixed", case_memfd_and_fixed },
	{ "concurrent_conversion", case_concurrent_conversion },
	{ "names_and_signals", case_names_and_signals },
	{ "owner_munmap", case_owner_munmap },
	{ "reattach_parked", case_reattach_parked },
	{ "self_attach_remove", case_self_attach_remove },
	{ "device_backend", case_device_backend },
	{ "misnamed_backend", case_misnamed_backend },
	{ "fork_with_threads", case_fork_with_threads },
	{ "library_data", case_library_data },
};

int main(int argc, char **argv)
{
	return run_named_case(cases, sizeof cases / sizeof *cases, argc, argv);
}
