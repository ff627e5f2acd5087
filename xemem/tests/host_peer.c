/*
 * host_peer: one side of a host <-> host attach across two daemons (libxpmem against whichever
 * clowderd CLOWDER_XEMEM_SOCKET names). node/clowderd/tests/xemem_multihop.rs drives it.
 *
 *   host_peer owner NAME BASE     exports 16 private pages as NAME (page i starts with BASE + i),
 *                                 prints its segid's enclave, waits for 43 in word 1 of page 0,
 *                                 checks that the attacher's write to page 15 arrived too, and
 *                                 removes the segment
 *   host_peer attacher NAME BASE  finds NAME, gets, attaches, checks the 16 pages, writes 7 into
 *                                 word 2 of page 15 and then 43 into word 1 of page 0, and touches
 *                                 the attachment until the owner's remove raises SIGBUS
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xpmem.h>
#include "attach_segment.h"

#define PAGE 4096UL
#define PAGES 16

static sigjmp_buf on_bus;

static void bus(int signal)
{
	(void)signal;
	siglongjmp(on_bus, 1);
}

static int owner(const char *name, uint64_t base)
{
	xpmem_segid_t segid;
	volatile uint64_t *buffer = export_patterned_segment(PAGES, base, name, "make", &segid);
	if (!buffer)
		return 2;
	if (!wait_for_word(&buffer[1], 43, 6000)) {
		printf("the attacher never wrote\n");
		return 3;
	}
	printf("the attacher wrote 43 and %s\n", buffer[15 * PAGE / 8 + 2] == 7 ? "7" : "not 7");
	printf("remove: %d\n", xpmem_remove(segid));
	/* The owner keeps its memory after remove, as with XPMEM. */
	printf("%d of %d pages intact after remove\n", pages_with_pattern(buffer, PAGES, base), PAGES);
	fflush(stdout);
	return 0;
}

/* Reads word 0 of `view` every 10 ms until that raises SIGBUS: whether it did within 30 s. */
static int sigbus_within_30s(volatile uint64_t *view)
{
	signal(SIGBUS, bus);
	if (sigsetjmp(on_bus, 1))
		return 1;
	for (int tries = 0; tries < 3000; tries++) {
		(void)view[0];
		usleep(10000);
	}
	return 0;
}

static int attacher(const char *name, uint64_t base)
{
	xpmem_apid_t apid;
	int failed = get_named_segment(name, 400, &apid);
	if (failed)
		return failed;
	int matching;
	volatile uint64_t *view = attach_and_check(apid, PAGES, base, "what the owner wrote", &matching);
	if (!view)
		return ATTACH_FAILED;
	view[15 * PAGE / 8 + 2] = 7;
	view[1] = 43;
	printf("wrote 43\n");
	fflush(stdout);
	if (!sigbus_within_30s(view)) {
		printf("no SIGBUS\n");
		return 5;
	}
	printf("SIGBUS after remove\n");
	/* The usual clean-up, whatever became of the segment. */
	int detached = xpmem_detach((void *)view);
	printf("detach: %d (errno %d)\n", detached, detached ? errno : 0);
	int released = xpmem_release(apid);
	printf("release: %d (errno %d)\n", released, released ? errno : 0);
	fflush(stdout);
	return matching == PAGES ? 0 : 4;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: host_peer owner|attacher NAME BASE\n");
		return 64;
	}
	uint64_t base = strtoull(argv[3], NULL, 0);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(argv[1], "owner") == 0)
		return owner(argv[2], base);
	if (strcmp(argv[1], "attacher") == 0)
		return attacher(argv[2], base);
	return 64;
}
