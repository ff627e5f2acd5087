/*
 * host_attacher: a host process that attaches an LWK job's named segment with the plain XPMEM
 * API (libxpmem -> clowderd's broker -> the daemon's XEMEM node -> the owner enclave), checks
 * the 16 pages lwk_named_owner filled (page i starts with 1000 + i) and writes 42 into word 1
 * of page 0, which the job is waiting for. node/clowderd/tests/xemem_lwk.rs drives both.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xpmem.h>
#include "attach_segment.h"

#define PAGE 4096UL
#define PAGES 16

int main(void)
{
	xpmem_apid_t apid;
	int failed = get_named_segment("lwk-owner-seg", 400, &apid);
	if (failed)
		return failed;
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
	int matching;
	volatile uint64_t *view = attach_and_check(apid, PAGES, 1000, "what the job wrote", &matching);
	if (!view)
		return ATTACH_FAILED;
	view[1] = 42;
	printf("wrote 42\n");
	xpmem_detach((void *)view);
	xpmem_release(apid);
	return matching == PAGES ? 0 : 4;
}
