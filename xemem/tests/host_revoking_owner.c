/*
 * host_revoking_owner: a host process that exports 16 private pages as the named segment
 * "host-revoke-seg" (page i starts with 3000 + i) and waits until an LWK job
 * (lwk_revoked_attacher) has attached them and written 44 into word 1 of page 0. Then it takes
 * the memory away: with "remove" by xpmem_remove (and checks that its own data survived),
 * with "exit" by exiting without a remove. Either way the job must get SIGBUS on its next
 * touch. crates/clowderd/tests/xemem_lwk.rs drives both.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL
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
	volatile uint64_t *buffer = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buffer == MAP_FAILED)
		return 1;
	for (unsigned long page = 0; page < PAGES; page++)
		buffer[page * PAGE / 8] = 3000 + page;
	xpmem_segid_t segid = xemem_make((void *)buffer, PAGES * PAGE, "host-revoke-seg");
	if (segid <= 0) {
		printf("make failed: errno %d\n", errno);
		return 2;
	}
	printf("made host-revoke-seg\n");
	fflush(stdout);
	for (int tries = 0; tries < 6000 && buffer[1] != 44; tries++)
		usleep(10000);
	if (buffer[1] != 44) {
		printf("the LWK job never wrote\n");
		return 3;
	}
	printf("the LWK job attached and wrote 44\n");
	/* Let the job spin on its attachment a moment, so the revoke finds it in use. */
	usleep(200000);
	if (!remove) {
		printf("exiting without a remove\n");
		return 0;
	}
	double start = now();
	int removed = xpmem_remove(segid);
	printf("remove: %d (%.0f ms, the enclave's acknowledgement included)\n", removed, (now() - start) * 1e3);
	int intact = 1;
	for (unsigned long page = 0; page < PAGES; page++)
		intact &= buffer[page * PAGE / 8] == 3000 + page;
	printf("owner data intact: %d\n", intact);
	return removed == 0 && intact ? 0 : 4;
}
