/*
 * host_held_attacher NAME FIRST: a host process that attaches another enclave's named segment
 * (libxpmem -> clowderd's broker), checks that page 0 starts with FIRST, prints "attached",
 * and then reads page 0 every 10 ms until the read raises SIGBUS (the owner's segment went:
 * removed, its job ended or its enclave ended, the daemon died) or 60 s pass. Prints whether
 * SIGBUS came. With a third argument "linger" it then waits for end of input before it exits,
 * so its mappings can be looked at. node/clowderd/tests/xemem_lwk.rs and xemem_crash.rs
 * drive it.
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
#include "named_segment.h"

static sigjmp_buf faulted;

static void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(faulted, 1);
}

int main(int argc, char **argv)
{
	if (argc != 3 && !(argc == 4 && strcmp(argv[3], "linger") == 0)) {
		fprintf(stderr, "usage: host_held_attacher NAME FIRST [linger]\n");
		return 2;
	}
	uint64_t first = strtoull(argv[2], NULL, 10);
	xpmem_segid_t segid = wait_for_named_segment(argv[1], 400);
	if (segid <= 0)
		return 1;
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	struct xpmem_addr addr = { .apid = apid, .offset = 0 };
	volatile uint64_t *page = apid > 0 ? xpmem_attach(addr, 4096, NULL) : (void *)-1;
	if (page == (void *)-1) {
		printf("get/attach failed: errno %d\n", errno);
		return 1;
	}
	printf("attached: page 0 starts with %llu (expected %llu)\n", (unsigned long long)page[0], (unsigned long long)first);
	fflush(stdout);
	if (page[0] != first)
		return 1;
	struct sigaction action = { .sa_handler = on_sigbus };
	sigaction(SIGBUS, &action, NULL);
	int sigbus = 0;
	if (sigsetjmp(faulted, 1)) {
		sigbus = 1;
	} else {
		for (int round = 0; round < 6000; round++) {
			(void)page[0];
			usleep(10000);
		}
	}
	printf("SIGBUS after the owner went: %d\n", sigbus);
	fflush(stdout);
	if (argc == 4)
		while (getchar() != EOF)
			;
	return sigbus ? 0 : 1;
}
