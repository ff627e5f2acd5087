/*
 * host_revoking_owner: a host process that exports 16 private pages as the named segment
 * "host-revoke-seg" (page i starts with 3000 + i) and waits until an LWK job
 * (lwk_revoked_attacher) has attached them and written 44 into word 1 of page 0. Then it takes
 * the memory away: with "remove" by xpmem_remove (and checks that its own data survived),
 * with "exit" by exiting without a remove. Either way the job must get SIGBUS on its next
 * touch. node/clowderd/tests/xemem_lwk.rs drives both.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>
#include "patterned_segment.h"

#define PAGES 16

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	int remove = argc > 1 && strcmp(argv[1], "remove") == 0;
	xpmem_segid_t segid;
	volatile uint64_t *buffer = export_patterned_segment(PAGES, 3000, "host-revoke-seg", "make", &segid);
	if (!buffer)
		return 2;
	if (!report_write(wait_for_word(&buffer[1], 44, 6000), "the LWK job", 44))
		return 3;
	/* Let the job spin on its attachment a moment, so the revoke finds it in use. */
	usleep(200000);
	if (!remove) {
		printf("exiting without a remove\n");
		return 0;
	}
	double start = now();
	int removed = xpmem_remove(segid);
	printf("remove: %d (%.0f ms, the enclave's acknowledgement included)\n", removed, (now() - start) * 1e3);
	int intact = pages_with_pattern(buffer, PAGES, 3000) == PAGES;
	printf("owner data intact: %d\n", intact);
	return removed == 0 && intact ? 0 : 4;
}
