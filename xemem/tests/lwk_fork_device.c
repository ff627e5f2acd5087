/*
 * lwk_fork_device: every process of an LWK job uses /dev/xpmem as an XEMEM process of its own
 * (its pid), and XEMEM's signals work between them. Parent and child talk over pipes.
 *   1. the parent makes a segment (page i starts with 100 + i) and attaches it itself; the
 *      child does not inherit the attachment (touching its address is SIGSEGV) and may map
 *      something else there;
 *   2. the child gets and attaches the parent's segment, checks it, writes 7 into page 0 and
 *      signals it; the parent, blocked in read(2) on its notify descriptor, wakes with 1;
 *   3. a non-blocking read then fails with EAGAIN and poll, select and epoll find nothing; two
 *      signals through its own permit make poll and select report it readable and an
 *      edge-triggered epoll report EPOLLIN once, and a read take 2; a notify descriptor for a
 *      segment the caller does not own is ENOENT;
 *   4. the child makes a named segment (page i starts with 300 + i); the parent looks it up,
 *      attaches and checks it, then tells the child to exit: the parent's next touch of the
 *      attachment is SIGBUS, get gives ENOENT, and detach and release still answer;
 *   5. another child owns a segment the parent attaches twice; after the child unmaps a page
 *      of it, the parent's next attach finds a hole there (the kernel's cache of resolved
 *      ranges must not hand out the old frame).
 * Prints one line per step; exits 0 when everything held.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xpmem.h>

#include "fault_probe.h"
#include "check_line.h"

#define PAGE 4096UL
#define PAGES 4


static void say(int fd, char c)
{
	if (write(fd, &c, 1) != 1)
		_exit(3);
}

static char hear(int fd)
{
	char c = 0;
	if (read(fd, &c, 1) != 1)
		return 0;
	return c;
}

static long *pages(void)
{
	long *memory = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return memory == MAP_FAILED ? NULL : memory;
}

static int pattern_is(volatile long *base, long first)
{
	for (int i = 0; i < PAGES; i++)
		if (base[i * PAGE / sizeof(long)] != first + i)
			return 0;
	return 1;
}

int main(void)
{
	long *mine = pages();
	if (!mine)
		return 2;
	for (int i = 0; i < PAGES; i++)
		mine[i * PAGE / sizeof(long)] = 100 + i;
	xpmem_segid_t segid = xpmem_make(mine, PAGES * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	check(segid > 0, "parent make");
	xpmem_apid_t self_apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	long *self_view = xpmem_attach((struct xpmem_addr){ .apid = self_apid, .offset = 0 }, PAGES * PAGE, NULL);
	check(self_view != (void *)-1 && pattern_is(self_view, 100), "parent attaches its own segment");
	int notify = xemem_notify_fd(segid);
	check(notify >= 0 && xemem_notify_fd(segid) == notify, "parent notify descriptor (one per segment)");
	int flags = fcntl(notify, F_GETFL);
	check(flags >= 0 && (flags & O_NONBLOCK), "notify descriptor is non-blocking, as the host's eventfd");
	fcntl(notify, F_SETFL, flags & ~O_NONBLOCK);

	int to_child[2], to_parent[2];
	if (pipe(to_child) < 0 || pipe(to_parent) < 0)
		return 2;
	pid_t child = fork();
	if (child == 0) {
		/* The child: the parent's attachment is not inherited. */
		check(touch((volatile int *)self_view, 0) == SIGSEGV, "child: the parent's attachment is absent (SIGSEGV)");
		check(xemem_notify_fd(segid) == -1 && errno == ENOENT, "child: no notify descriptor for the parent's segment");
		xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
		long *view = apid > 0 ? xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGES * PAGE, NULL) : (void *)-1;
		check(view != (void *)-1 && pattern_is(view, 100), "child: gets and attaches the parent's segment");
		if (view != (void *)-1)
			view[0] = 7;
		check(xemem_signal(apid) == 0, "child: signals the parent's segment");
		check(xpmem_detach(view) == 0 && xpmem_release(apid) == 0, "child: detach, release");

		long *own = pages();
		for (int i = 0; i < PAGES; i++)
			own[i * PAGE / sizeof(long)] = 300 + i;
		xpmem_segid_t child_segid = xemem_make(own, PAGES * PAGE, "lwk-fork-child-seg");
		check(child_segid > 0, "child: makes a named segment");
		say(to_parent[1], 'm');
		hear(to_child[0]); /* the parent has attached it: exit without removing it */
		_exit(failures ? 1 : 0);
	}
	uint64_t count = 0;
	ssize_t got = read(notify, &count, sizeof count);
	check(got == 8 && count == 1, "parent: a blocking read of the notify descriptor wakes with 1");
	check(mine[0] == 7, "parent: sees the child's write");
	fcntl(notify, F_SETFL, flags);
	check(read(notify, &count, sizeof count) == -1 && errno == EAGAIN, "parent: then a non-blocking read is EAGAIN");
	struct pollfd entry = { .fd = notify, .events = POLLIN };
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event interest = { .events = EPOLLIN | EPOLLET, .data.u64 = 42 }, event = { 0 };
	fd_set readable;
	FD_ZERO(&readable);
	FD_SET(notify, &readable);
	struct timeval no_wait = { 0, 0 };
	check(poll(&entry, 1, 0) == 0 && entry.revents == 0 && epoll_ctl(ep, EPOLL_CTL_ADD, notify, &interest) == 0 &&
	      epoll_wait(ep, &event, 1, 0) == 0 && select(notify + 1, &readable, NULL, NULL, &no_wait) == 0,
	      "parent: poll, select and epoll find nothing to read");
	check(xemem_signal(self_apid) == 0 && xemem_signal(self_apid) == 0, "parent: signals its own segment twice");
	FD_SET(notify, &readable);
	check(poll(&entry, 1, -1) == 1 && entry.revents == POLLIN && select(notify + 1, &readable, NULL, NULL, NULL) == 1 &&
	      FD_ISSET(notify, &readable) && epoll_wait(ep, &event, 1, -1) == 1 && event.events == EPOLLIN &&
	      event.data.u64 == 42 && epoll_wait(ep, &event, 1, 0) == 0,
	      "parent: poll, select and epoll (edge-triggered: once) find the descriptor readable");
	close(ep);
	check(read(notify, &count, sizeof count) == 8 && count == 2, "parent: reads a count of 2");

	check(hear(to_parent[0]) == 'm', "parent: the child made its segment");
	xpmem_segid_t child_segid = xemem_lookup_segid("lwk-fork-child-seg");
	xpmem_apid_t apid = xpmem_get(child_segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	long *view = apid > 0 ? xpmem_attach((struct xpmem_addr){ .apid = apid, .offset = 0 }, PAGES * PAGE, NULL) : (void *)-1;
	check(view != (void *)-1 && pattern_is(view, 300), "parent: attaches the child's segment");
	check(xemem_notify_fd(child_segid) == -1 && errno == ENOENT, "parent: no notify descriptor for the child's segment");
	say(to_child[1], 'x');
	int status = -1;
	waitpid(child, &status, 0);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited 0");
	check(touch((volatile int *)view, 0) == SIGBUS, "parent: the exited child's segment is gone (SIGBUS)");
	check(xpmem_get(child_segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) == -1 && errno == ENOENT, "parent: get of it is ENOENT");
	check(xpmem_detach(view) == 0, "parent: detach 0");
	xpmem_release(apid);
	check(xpmem_detach(self_view) == 0 && xpmem_release(self_apid) == 0 && xpmem_remove(segid) == 0, "parent: detach, release, remove");

	/* 5. a second child owns a segment; the parent attaches it twice (the kernel answers the
	 *    second from its cache of resolved ranges), the child unmaps page 1, and the parent's
	 *    next attach finds the hole there (SIGBUS), not the frame it was given before */
	pid_t owner = fork();
	if (owner == 0) {
		long *source = pages();
		for (int i = 0; i < PAGES; i++)
			source[i * PAGE / sizeof(long)] = 500 + i;
		check(xemem_make(source, PAGES * PAGE, "lwk-fork-remapped") > 0, "owner child: makes a named segment");
		say(to_parent[1], 'm');
		hear(to_child[0]);
		munmap((char *)source + PAGE, PAGE);
		say(to_parent[1], 'u');
		hear(to_child[0]);
		_exit(failures ? 1 : 0);
	}
	check(hear(to_parent[0]) == 'm', "parent: the owner child made its segment");
	xpmem_segid_t remapped = xemem_lookup_segid("lwk-fork-remapped");
	xpmem_apid_t remapped_apid = xpmem_get(remapped, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	struct xpmem_addr whole = { .apid = remapped_apid, .offset = 0 };
	int same_twice = 1;
	for (int attach = 0; attach < 2; attach++) {
		long *before = xpmem_attach(whole, PAGES * PAGE, NULL);
		same_twice &= before != (void *)-1 && pattern_is(before, 500) && xpmem_detach(before) == 0;
	}
	check(same_twice, "parent: attaches it twice");
	say(to_child[1], 'u');
	check(hear(to_parent[0]) == 'u', "parent: the owner child unmapped page 1");
	long *after = xpmem_attach(whole, PAGES * PAGE, NULL);
	check(after != (void *)-1 && touch((volatile int *)(after + PAGE / sizeof(long)), 0) == SIGBUS && after[0] == 500,
	      "parent: attached again, page 1 is a hole (SIGBUS) and page 0 as before");
	check(xpmem_detach(after) == 0 && xpmem_release(remapped_apid) == 0, "parent: detach, release");
	say(to_child[1], 'x');
	waitpid(owner, &status, 0);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "owner child exited 0");
	printf("%s\n", failures ? "lwk_fork_device: FAILED" : "lwk_fork_device: all passed");
	return failures ? 1 : 0;
}
