/*
 * host_attacher: a host process that attaches an LWK job's named segment with the plain XPMEM
 * API (libxpmem -> clowderd's broker -> the daemon's XEMEM node -> the owner enclave), checks
 * the 16 pages lwk_named_owner filled (page i starts with 1000 + i) and writes 42 into word 1
 * of page 0, which the job is waiting for. crates/clowderd/tests/xemem_lwk.rs drives both.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xpmem.h>
#include "named_segment.h"

#define PAGE 4096UL
#define PAGES 16

int main(void)
{
	xpmem_segid_t segid = wait_for_named_segment("lwk-owner-seg", 400);
	if (segid <= 0)
		return 1;
	printf("found a segment of enclave %lld\n", (long long)(segid >> 32));
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0) {
		printf("get failed: errno %d\n", errno);
		return 2;
	}
	/* The permit is this process's: another process (a fork child) may neither attach through
	 * it nor release it (EACCES, as for a host segment). */
	pid_t child = fork();
	if (child == 0) {
		struct xpmem_addr stolen = { .apid = apid, .offset = 0 };
		int attach_refused = xpmem_attach(stolen, PAGE, NULL) == (void *)-1 && errno == EACCES;
		int release_refused = xpmem_release(apid) == -1 && errno == EACCES;
		_exit(attach_refused && release_refused ? 0 : 1);
	}
	int status = -1;
	waitpid(child, &status, 0);
	printf(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "another process is refused the permit\n"
							     : "another process used the permit\n");
	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	volatile uint64_t *view = xpmem_attach(address, PAGES * PAGE, NULL);
	if (view == (void *)-1) {
		printf("attach failed: errno %d\n", errno);
		return 3;
	}
	int matching = 0;
	for (unsigned long page = 0; page < PAGES; page++)
		matching += view[page * PAGE / 8] == 1000 + page;
	printf("%d of %d pages hold what the job wrote\n", matching, PAGES);
	view[1] = 42;
	printf("wrote 42\n");
	xpmem_detach((void *)view);
	xpmem_release(apid);
	return matching == PAGES ? 0 : 4;
}
